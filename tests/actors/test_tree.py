"""Supervision trees: a SupervisorSpec as a child of another."""

from __future__ import annotations

import os
import signal

import pytest
import trio
from sample_actors import FailingStartup, Idle

from rt.actors import (
    ActorSpec,
    ActorState,
    Strategy,
    Supervisor,
    SupervisorSpec,
    open_supervisor,
)
from rt.errors import EscalationError

TIMEOUT = 20


def _workers(*children: ActorSpec, **options: object) -> SupervisorSpec:
    options.setdefault("backoff_initial", 0.01)
    return SupervisorSpec(children=children, name="workers", **options)  # type: ignore[arg-type]


async def test_a_crash_inside_a_subtree_is_handled_by_the_subtree() -> None:
    spec = SupervisorSpec(
        children=(ActorSpec("front", Idle), _workers(ActorSpec("w1", Idle), ActorSpec("w2", Idle))),
        strategy=Strategy.ONE_FOR_ALL,  # would restart "front" if the subtree failed
    )
    async with open_supervisor(spec) as sup:
        before = sup.status()
        assert before.healthy and before.actor("workers").pid is None
        assert [s.name for s in before.subtrees] == ["workers"]
        os.kill(before.actor("w1").pid, signal.SIGKILL)  # type: ignore[arg-type]
        with trio.fail_after(TIMEOUT):
            after = await sup.wait_for(
                lambda s: (
                    s.actor("w1").incarnation == 2 and s.actor("w1").state is ActorState.RUNNING
                )
            )
        assert after.actor("w2").pid == before.actor("w2").pid
        assert after.actor("front").pid == before.actor("front").pid
        assert after.actor("workers").restart_count == 0 and after.healthy
        pids = [after.actor(n).pid for n in ("front", "w1", "w2")]
    assert all(pid and not os.path.exists(f"/proc/{pid}") for pid in pids)


async def test_an_escalating_subtree_is_restarted_and_can_escalate_the_root() -> None:
    spec = SupervisorSpec(
        children=(ActorSpec("front", Idle), _workers(ActorSpec("doomed", FailingStartup), max_restarts=1)),
        max_restarts=1,
        backoff_initial=0.01,
    )  # fmt: skip
    sup = Supervisor(spec)
    with pytest.raises(EscalationError) as caught, trio.fail_after(TIMEOUT):
        await sup.run()
    message = str(caught.value)
    assert "actor 'workers' exited once too often: more than 1 restarts" in message
    assert "escalated (supervisor 'workers': actor 'doomed' exited once too often" in message
    status = sup.status()
    assert status.actor("workers").state is ActorState.FAILED
    assert status.actor("workers").restart_count == 1
    assert status.actor("front").state is ActorState.STOPPED
    assert status.actor("front").restart_count == 0

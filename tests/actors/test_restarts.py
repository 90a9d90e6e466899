"""How restarts run: exits charged to the requests a child had in hand, and
restarts that proceed independently (one_for_one) or in order (group strategies)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio
from sample_actors import DiesWithRequests, GatedStartup, Idle
from supervision_lib import TIMEOUT, is_running, quick_spec, wait_until

from rt.actors import (
    ActorSpec,
    ActorState,
    Strategy,
    Supervisor,
    open_supervisor,
)
from rt.errors import EscalationError


@pytest.mark.parametrize("sigkill", [False, True], ids=["exit", "sigkill"])
async def test_crashes_with_requests_in_hand_are_restarted_but_never_escalate(
    sigkill: bool,
) -> None:
    spec = quick_spec(
        ActorSpec("tok", DiesWithRequests, kwargs={"sigkill": sigkill}),
        ActorSpec("other", Idle),
        max_restarts=2,
        backoff_initial=0.05,
    )
    async with open_supervisor(spec) as sup:
        status = await wait_until(sup, lambda s: s.actor("tok").restart_count >= 4)
        tok = status.actor("tok")
        assert status.escalated is None and status.restarts_in_window == 0
        assert tok.request_crashes >= 4
        how = "killed by SIGKILL" if sigkill else "exit code 1"
        assert tok.last_exit_reason == (
            f"{how} (with requests in hand: not counted toward escalation)"
        )
        assert status.actor("other").request_crashes == 0
        assert status.actor("other").state is ActorState.RUNNING


@pytest.mark.parametrize(
    "flagged_until", [0, 1], ids=["idle", "after-a-predecessor-died-with-requests"]
)
async def test_crashes_without_requests_in_hand_still_escalate(flagged_until: int) -> None:
    # flagged_until=1: the first incarnation is SIGKILLed inside handling_requests(),
    # leaving the flag set in shared memory; the later ones die idle. Only the
    # reset before each start keeps their deaths from being charged to requests.
    kwargs = {"flagged_until": flagged_until, "sigkill": True}
    sup = Supervisor(quick_spec(ActorSpec("tok", DiesWithRequests, kwargs=kwargs), max_restarts=2))
    with pytest.raises(EscalationError) as caught, trio.fail_after(TIMEOUT):
        await sup.run()
    assert "actor 'tok' exited once too often: more than 2 restarts within 60 s" in str(
        caught.value
    )
    assert "counting every actor of the supervisor (tok 3)" in str(caught.value)
    tok = sup.status().actor("tok")
    assert tok.state is ActorState.FAILED
    assert tok.request_crashes == flagged_until
    assert tok.restart_count == 2 + flagged_until
    assert tok.last_exit_reason == "killed by SIGKILL"


async def test_a_slow_start_up_does_not_hold_up_another_childs_restart(tmp_path: Path) -> None:
    gate = tmp_path / "gate"  # "slow"'s second start-up lasts until the test creates it
    spec = quick_spec(
        ActorSpec("slow", GatedStartup, kwargs={"gate": str(gate), "held": 2}),
        ActorSpec("quick", Idle),
    )
    async with open_supervisor(spec) as sup:
        first = sup.status()
        os.kill(first.actor("slow").pid, signal.SIGKILL)  # type: ignore[arg-type]
        await wait_until(sup, lambda s: s.actor("slow").incarnation == 2)  # starting, held
        os.kill(first.actor("quick").pid, signal.SIGKILL)  # type: ignore[arg-type]
        # Back while "slow" is still held in its start-up (restarts one at a time:
        # never, and this wait times out).
        status = await wait_until(sup, is_running("quick", 2))
        assert status.actor("slow").state is ActorState.STARTING
        gate.touch()
        status = await wait_until(sup, is_running("slow", 2))
        assert status.actor("quick").incarnation == 2 and status.healthy


@pytest.mark.parametrize("strategy", [Strategy.ONE_FOR_ALL, Strategy.REST_FOR_ONE])
async def test_a_failure_during_a_group_restart_restarts_the_group_again_in_order(
    strategy: Strategy, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"  # "b"'s second start-up lasts until the test creates it
    spec = quick_spec(
        ActorSpec("a", Idle),
        ActorSpec("b", GatedStartup, kwargs={"gate": str(gate), "held": 2}),
        ActorSpec("c", Idle),
        strategy=strategy,
        max_restarts=10,
    )
    async with open_supervisor(spec) as sup:
        os.kill(sup.status().actor("a").pid, signal.SIGKILL)  # type: ignore[arg-type]
        # the group restart has started "a" again and is starting "b" (held)
        during = await wait_until(sup, lambda s: s.actor("b").incarnation == 2)
        assert during.actor("a").state is ActorState.RUNNING
        assert during.actor("c").state is ActorState.RESTARTING
        os.kill(during.actor("a").pid, signal.SIGKILL)  # type: ignore[arg-type]
        # the supervisor has booked that exit while "b" is still held: now let it start
        await wait_until(sup, lambda s: s.actor("a").state is ActorState.RESTARTING)
        gate.touch()
        status = await wait_until(sup, lambda s: all(is_running(n, 3)(s) for n in "abc"))
        a, b, c = (status.actor(n) for n in "abc")
        # each started once per group restart, never twice at once; in start order
        assert [x.restart_count for x in (a, b, c)] == [2, 2, 2]
        assert a.ready_at < b.ready_at < c.ready_at  # type: ignore[operator]
        # the second restart stopped "c" (incarnation 2) before "b", in reverse order
        assert c.last_exit_at < b.last_exit_at  # type: ignore[operator]
        # (a child stopped right after it reported ready may still die of the SIGTERM)
        assert b.last_exit_reason.startswith("stopped by the supervisor (")  # type: ignore[union-attr]
        assert c.last_exit_reason.startswith("stopped by the supervisor (")  # type: ignore[union-attr]
        assert status.restarts_in_window == 2

"""What a child's heartbeat tells its supervisor: progress, not just a live trio
loop (work on requests stuck in a worker thread is a hang), and that it is
going down as soon as it knows (before its slow exit). Real child processes."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import trio
from sample_actors import SlowToDie, WorksInAThread
from supervision_lib import is_running, quick_spec, wait_until

from rt.actors import ActorSpec, ActorState, open_supervisor
from rt.actors.heartbeat import Heartbeat, HeartbeatTable
from rt.shm.segment import new_run_prefix


def test_requests_in_hand_date_progress_from_when_they_were_taken() -> None:
    table = HeartbeatTable.create(new_run_prefix(), 2)
    try:
        child = Heartbeat(table.name, 1)
        child.beat()
        assert table.age(1) < 5 and not table.handling(1)
        child.set_handling(True)
        time.sleep(0.05)
        child.beat()  # a timer beating on while the work is stuck elsewhere
        assert table.age(1) >= 0.05 and table.handling(1)
        # a start later than the beat (a restart's ready time) still counts
        assert table.age(1, since_ns=1 << 62) == 0.0
        child.set_handling(False)
        assert not table.handling(1) and not table.going_down(1)
        child.set_going_down()
        assert table.going_down(1) and not table.going_down(0)
        table.reset(1)
        assert not table.going_down(1) and table.last_beat_ns(1) == 0
    finally:
        table.close()


async def test_work_on_requests_stuck_in_a_thread_is_a_hang() -> None:
    """The trio thread beats on while the work never ends: the watchdog kills the
    child all the same, and charges the death to the requests in hand (so it
    does not count toward escalation). It used to run forever, reported healthy."""
    timeout = 1.0
    spec = quick_spec(
        ActorSpec("stuck", WorksInAThread, kwargs={"seconds": 0.0, "units": 1, "stuck": True}),
        watchdog_timeout=timeout,
        max_restarts=0,
    )
    async with open_supervisor(spec) as sup:
        again = await wait_until(sup, is_running("stuck", 2))
    actor = again.actor("stuck")
    reason = actor.last_exit_reason or ""
    found = re.match(r"watchdog: no progress for (\d+\.\d+) s \(requests in hand\)", reason)
    assert found, reason
    assert float(found[1]) >= timeout
    assert "not counted toward escalation" in reason
    assert actor.request_crashes == 1 and again.restarts_in_window == 0


async def test_work_on_requests_within_the_watchdog_timeout_is_not_a_hang() -> None:
    """Units of work each well within the timeout, together well beyond it: the
    rule is per unit of work, so the child is never killed."""
    timeout = 2.0
    spec = quick_spec(
        ActorSpec("busy", WorksInAThread, kwargs={"seconds": timeout / 4, "units": 8}),
        watchdog_timeout=timeout,
    )
    async with open_supervisor(spec) as sup:
        await trio.sleep(timeout / 4 * 8 + timeout)
        status = sup.status()
    actor = status.actor("busy")
    assert actor.incarnation == 1 and actor.restart_count == 0, actor.last_exit_reason


async def test_a_crash_is_reported_before_the_child_has_exited(tmp_path: Path) -> None:
    """An exception reaching the child's top level makes its status EXITING (so
    the tree unhealthy) at once, while the child still tears down; it used to
    read RUNNING until the process had exited (0.1-3.8 s for a scheduler)."""
    gate = tmp_path / "gate"
    spec = quick_spec(ActorSpec("slow", SlowToDie, args=(str(gate),)), watchdog_timeout=60)
    async with open_supervisor(spec) as sup:
        status = await wait_until(sup, lambda s: s.actor("slow").state is not ActorState.RUNNING)
        actor = status.actor("slow")
        assert actor.state is ActorState.EXITING and not status.healthy
        assert actor.last_exit_at is None  # the exit is still to come: held at the gate
        assert actor.pid is not None and os.path.exists(f"/proc/{actor.pid}")
        gate.touch()
        again = await wait_until(sup, is_running("slow", 2))
        assert again.healthy
        assert again.actor("slow").last_exit_reason == "exit code 1 (RuntimeError: boom, slowly)"

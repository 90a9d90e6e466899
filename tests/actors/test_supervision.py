"""Supervision with real child processes: strategies, restart types, escalation,
shutdown, the watchdog, and the status snapshot."""

from __future__ import annotations

import os
import re
import resource
import signal
import time

import pytest
import trio
from sample_actors import (
    BlocksItsStartup,
    BlocksSigterm,
    ExitAfter,
    ExitsInItsStartup,
    FailingStartup,
    FailsItsFirstStart,
    Forward,
    Idle,
    RaisesInANursery,
    RefusesItsConfig,
)
from supervision_lib import TIMEOUT, is_running, quick_spec, wait_until

from rt.actors import (
    ActorSpec,
    ActorState,
    FaultPlan,
    Restart,
    RingDecl,
    Strategy,
    Supervisor,
    open_supervisor,
)
from rt.errors import ActorStartupError, EscalationError
from rt.shm import RingReceiver, RingSender


@pytest.mark.parametrize(
    ("strategy", "restarted"),
    [
        (Strategy.ONE_FOR_ONE, {"b"}),
        (Strategy.REST_FOR_ONE, {"b", "c"}),
        (Strategy.ONE_FOR_ALL, {"a", "b", "c"}),
    ],
)
async def test_strategies_restart_the_right_children(
    strategy: Strategy, restarted: set[str]
) -> None:
    spec = quick_spec(*(ActorSpec(n, Idle) for n in "abc"), strategy=strategy)
    async with open_supervisor(spec) as sup:
        before = sup.status()
        assert [a.state for a in before.actors] == [ActorState.RUNNING] * 3
        os.kill(before.actor("b").pid, signal.SIGKILL)  # type: ignore[arg-type]
        after = await wait_until(sup, is_running("b", 2))
        after = await wait_until(
            sup, lambda s: all(a.state is ActorState.RUNNING for a in s.actors)
        )
        for name in "abc":
            was, now = before.actor(name), after.actor(name)
            if name in restarted:
                assert now.incarnation == 2 and now.pid != was.pid and now.restart_count == 1
            else:
                assert now.incarnation == 1 and now.pid == was.pid and now.restart_count == 0
        assert after.actor("b").last_exit_reason == "killed by SIGKILL"
        assert after.restarts_in_window == 1


async def test_transient_restarts_after_a_crash_but_not_after_a_clean_exit() -> None:
    spec = quick_spec(
        ActorSpec("clean", ExitAfter, kwargs={"code": 0, "delay": 0.1}, restart=Restart.TRANSIENT),
        ActorSpec("crash", ExitAfter, kwargs={"code": 3, "delay": 0.1}, restart=Restart.TRANSIENT),
        max_restarts=100,
    )
    async with open_supervisor(spec) as sup:
        status = await wait_until(
            sup,
            lambda s: (
                s.actor("clean").state is ActorState.STOPPED and s.actor("crash").incarnation >= 2
            ),
        )
        clean = status.actor("clean")
        assert clean.incarnation == 1 and clean.restart_count == 0
        assert clean.last_exit_reason == "exit code 0" and clean.pid is None
        assert status.actor("crash").last_exit_reason == "exit code 3"


async def test_permanent_restarts_even_after_a_clean_exit() -> None:
    spec = quick_spec(ActorSpec("p", ExitAfter, kwargs={"code": 0, "delay": 0.1}), max_restarts=100)
    async with open_supervisor(spec) as sup:
        status = await wait_until(sup, lambda s: s.actor("p").restart_count >= 1)
        assert status.actor("p").last_exit_reason == "exit code 0"


async def test_temporary_is_never_restarted() -> None:
    spec = quick_spec(
        ActorSpec("t", ExitAfter, kwargs={"code": 5, "delay": 0.05}, restart=Restart.TEMPORARY),
        ActorSpec("other", Idle),
    )
    async with open_supervisor(spec) as sup:
        status = await wait_until(sup, lambda s: s.actor("t").state is ActorState.FAILED)
        assert status.actor("t").restart_count == 0
        assert status.actor("t").last_exit_reason == "exit code 5"
        assert status.actor("other").state is ActorState.RUNNING
        assert not status.healthy


async def test_startup_crash_loop_escalates_after_r_restarts() -> None:
    sup = Supervisor(
        quick_spec(ActorSpec("idle", Idle), ActorSpec("doomed", FailingStartup), max_restarts=2)
    )
    with pytest.raises(EscalationError) as caught:
        with trio.fail_after(TIMEOUT):
            await sup.run()
    message = str(caught.value)
    assert "actor 'doomed' exited once too often: more than 2 restarts within 60 s" in message
    assert "(doomed 3)" in message  # the idle actor never restarted
    assert "startup failed: actor 'doomed' (pid " in message
    assert "raised during start-up: RuntimeError: this actor cannot start: boom" in message
    cause = caught.value.__cause__
    assert isinstance(cause, ActorStartupError)
    assert 'raise RuntimeError("this actor cannot start: boom")' in cause.child_traceback
    status = sup.status()
    assert status.actor("doomed").state is ActorState.FAILED
    assert status.actor("doomed").restart_count == 2
    assert status.actor("idle").state is ActorState.STOPPED and status.actor("idle").pid is None
    assert status.escalated == message


async def test_a_start_up_that_exits_or_holds_its_thread_a_while_is_told_as_before() -> None:
    """Its start-up beating, in a nursery: sys.exit(3) there came out as an exception
    group (exit code 1); a load done in place on the trio thread, for less than a
    tenth of startup_timeout, is no hang whatever the watchdog's timeout."""
    spec = quick_spec(
        ActorSpec("exits", ExitsInItsStartup, restart=Restart.TEMPORARY),
        ActorSpec("slow", BlocksItsStartup, args=(3.0,), startup_timeout=60.0),
        watchdog_timeout=1.0,
    )
    async with open_supervisor(spec) as sup:
        status = await wait_until(sup, lambda s: s.actor("exits").state is ActorState.FAILED)
        assert status.actor("exits").last_exit_reason.endswith("(exit code 3)"), status
        assert status.actor("slow").state is ActorState.RUNNING
        assert status.actor("slow").restart_count == 0


async def test_a_start_up_that_refuses_its_configuration_escalates_at_once() -> None:
    """Restarting could only fail the same way: it was retried until the
    restart intensity gave out (seconds of backoff, with a big model minutes)."""
    spec = quick_spec(ActorSpec("idle", Idle), ActorSpec("wrong", RefusesItsConfig))
    with pytest.raises(ExceptionGroup) as caught, trio.fail_after(TIMEOUT):
        async with open_supervisor(spec):
            pytest.fail("the body ran with an actor that never started")
    (escalation,) = caught.value.exceptions
    assert isinstance(escalation, EscalationError)
    assert "actor 'wrong' cannot start with this configuration" in str(escalation)
    assert "ConfigError: this actor's options are wrong: size=-1" in str(escalation)
    assert isinstance(escalation.__cause__, ActorStartupError) and escalation.__cause__.refused


async def test_a_child_that_never_comes_up_escalates_however_slow_its_starts() -> None:
    """Each failed start slower than the restart window never trips the intensity
    (a model that loads for minutes, then fails): the body waited for ever."""
    spec = quick_spec(
        ActorSpec("idle", Idle),
        ActorSpec("doomed", FailingStartup),
        max_restarts=2,
        max_seconds=0.001,
    )
    with pytest.raises(ExceptionGroup) as caught, trio.fail_after(TIMEOUT):
        async with open_supervisor(spec):
            pytest.fail("the body ran with an actor that never started")
    (escalation,) = caught.value.exceptions
    assert "actor 'doomed' never came up in 3 starts" in str(escalation)


async def test_the_body_starts_once_a_child_whose_first_start_failed_is_up(tmp_path) -> None:
    marker = str(tmp_path / "started-once")
    spec = quick_spec(ActorSpec("idle", Idle), ActorSpec("late", FailsItsFirstStart, (marker,)))
    with trio.fail_after(TIMEOUT):
        async with open_supervisor(spec) as sup:
            status = sup.status()
            assert status.healthy, status  # the body used to start with it restarting
            assert status.actor("late").restart_count == 1


async def test_backoff_spaces_out_a_crash_loop() -> None:
    spec = quick_spec(
        ActorSpec("loop", ExitAfter, kwargs={"code": 1}),
        backoff_initial=0.2,
        backoff_max=0.4,
        max_restarts=100,
    )
    async with open_supervisor(spec) as sup:
        # incarnation 2 came up (it may already say it is exiting: it exits at once)
        first = await wait_until(
            sup,
            lambda s: s.actor("loop").incarnation == 2 and s.actor("loop").ready_at is not None,
        )
        later = await wait_until(sup, lambda s: s.actor("loop").incarnation >= 4)
    # incarnations 2, 3, 4 waited 0, 0.2 and 0.4 s after their predecessor's exit
    assert later.actor("loop").last_exit_at - first.actor("loop").ready_at >= 0.2  # type: ignore[operator]


async def test_shutdown_stops_in_reverse_order_and_kills_a_child_ignoring_sigterm() -> None:
    spec = quick_spec(
        ActorSpec("polite", Idle), ActorSpec("stubborn", BlocksSigterm), shutdown_grace=0.5
    )
    async with open_supervisor(spec) as sup:
        pids = {a.name: a.pid for a in sup.status().actors}
        stop_began = time.monotonic()
    status = sup.status()
    assert all(a.state is ActorState.STOPPED and a.pid is None for a in status.actors)
    polite, stubborn = status.actor("polite"), status.actor("stubborn")
    assert stubborn.last_exit_reason == (
        "stopped by the supervisor (killed by SIGKILL, SIGKILL after 0.5 s grace)"
    )
    assert polite.last_exit_reason == "stopped by the supervisor (exit code 0)"
    # SIGKILLed once the grace was out, and soon after. Timed to "stubborn"'s exit,
    # not to the end of the shutdown, which includes "polite"'s interpreter exiting
    # (slow on 2 shared cores); the margin allows for late wake-ups there too.
    assert 0.5 <= stubborn.last_exit_at - stop_began < 0.5 + 4  # type: ignore[operator]
    # reverse start order: "polite" was asked to stop only once "stubborn" was gone
    assert polite.last_exit_at > stubborn.last_exit_at  # type: ignore[operator]
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}")


async def test_a_polite_child_stops_well_within_the_grace_period() -> None:
    # A grace far longer than a polite child takes to exit, even on 2 shared cores
    # (usually 0.1 s), so that a shutdown that waited the grace out stands apart.
    grace = 30.0
    spec = quick_spec(ActorSpec("polite", Idle), shutdown_grace=grace)
    async with open_supervisor(spec) as sup:
        start = trio.current_time()
    assert trio.current_time() - start < grace / 3
    # SIGTERM did it (stopped this soon after ready, it may die of the signal itself)
    assert "SIGKILL" not in (sup.status().actor("polite").last_exit_reason or "")


async def test_a_hung_child_is_killed_and_restarted_by_the_watchdog() -> None:
    plan = FaultPlan.from_dict(
        {
            "faults": [
                {
                    "actor": "spin",
                    "point": "loop",
                    "action": "hang",
                    "hang": "gil",
                    "after": 3,
                    "incarnation": 1,
                },
                {
                    "actor": "nap",
                    "point": "loop",
                    "action": "hang",
                    "hang": "sleep",
                    "after": 3,
                    "incarnation": 1,
                },
            ]
        }
    )
    timeout = 1.0
    spec = quick_spec(ActorSpec("spin", Idle), ActorSpec("nap", Idle), watchdog_timeout=timeout)
    async with open_supervisor(spec, fault_plan=plan) as sup:
        again = await wait_until(
            sup, lambda s: is_running("spin", 2)(s) and is_running("nap", 2)(s)
        )
        for name in ("spin", "nap"):
            reason = again.actor(name).last_exit_reason or ""
            found = re.match(r"watchdog: no heartbeat for (\d+\.\d+) s", reason)
            assert found, reason
            # Killed once the heartbeat was `timeout` old, and not much later: its
            # age when the watchdog saw it, so no restart time is counted. Generous
            # (the supervisor's poll may wake late on 2 shared cores), yet well
            # under the 10 s default timeout.
            assert timeout <= float(found[1]) < timeout + 4
        # the restarted incarnations run: their heartbeats stay fresh
        await trio.sleep(timeout * 1.5)
        status = sup.status()
        assert status.actor("spin").incarnation == 2
        assert status.actor("spin").heartbeat_age < timeout  # type: ignore[operator]


async def test_status_snapshot_is_frozen_and_complete() -> None:
    async with open_supervisor(quick_spec(ActorSpec("a", Idle), name="tree")) as sup:
        status = sup.status()
        assert status.name == "tree" and status.strategy == "one_for_one" and status.healthy
        actor = status.actor("a")
        assert actor.pid and actor.incarnation == 1 and actor.last_exit_reason is None
        assert 0 <= actor.heartbeat_age < 5  # type: ignore[operator]
        with pytest.raises(AttributeError):
            actor.pid = 1  # type: ignore[misc]
        with pytest.raises(KeyError, match="no actor named 'b'"):
            status.actor("b")
        assert status.running
    after = sup.status()
    assert not after.running and not after.healthy
    assert after.actor("a").state is ActorState.STOPPED and after.actor("a").pid is None


async def test_children_stop_when_the_supervisor_is_cancelled() -> None:
    async with trio.open_nursery() as nursery:
        sup = await nursery.start(
            Supervisor(quick_spec(ActorSpec("a", Idle), ActorSpec("b", Idle))).run
        )
        pids = [a.pid for a in sup.status().actors]
        nursery.cancel_scope.cancel()
    assert all(pid and not os.path.exists(f"/proc/{pid}") for pid in pids)
    assert all(a.state is ActorState.STOPPED for a in sup.status().actors)


async def test_crash_actions_each_end_the_child_as_described() -> None:
    plan = FaultPlan.from_dict(
        {
            "seed": 1,
            "faults": [
                {"actor": "raiser", "point": "loop", "action": "raise"},
                {"actor": "exiter", "point": "loop", "action": "exit", "exit_code": 7},
                {"actor": "killer", "point": "loop", "action": "sigkill", "after": 1},
                {"actor": "segv", "point": "loop", "action": "sigsegv"},
                {"actor": "oom", "point": "startup", "action": "oom"},
            ],
        }
    )
    names = ("raiser", "exiter", "killer", "segv", "oom")
    spec = quick_spec(*(ActorSpec(n, Idle, restart=Restart.TEMPORARY) for n in names))
    async with open_supervisor(spec, fault_plan=plan) as sup:
        status = await wait_until(
            sup, lambda s: all(a.state is ActorState.FAILED for a in s.actors)
        )
    reasons = {a.name: a.last_exit_reason or "" for a in status.actors}
    assert reasons["raiser"].startswith(
        "exit code 1 (rt.errors.FaultInjected: fault plan rule 0: raise"
    )
    assert reasons["exiter"] == "exit code 7"
    assert reasons["killer"] == "killed by SIGKILL"
    assert reasons["segv"] == "killed by SIGSEGV"
    assert reasons["oom"].startswith("startup failed: actor 'oom' (pid ")
    assert "raised during start-up: MemoryError: fault plan rule 4: oom" in reasons["oom"]


async def test_detection_is_immediate() -> None:
    async with open_supervisor(quick_spec(ActorSpec("a", Idle))) as sup:
        pid = sup.status().actor("a").pid
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]
        status = await wait_until(sup, lambda s: s.actor("a").last_exit_at is not None)
        # Usually a few ms. The margin allows for the dying child and this process to
        # wait for a core on a loaded machine; an exit missed by the pidfd would be
        # found by the watchdog only, after its 10 s.
        assert status.actor("a").last_exit_at - killed_at < 2.0  # type: ignore[operator]


def state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


async def test_a_dead_child_is_not_running_before_its_exit_is_handled() -> None:
    """Between a child's death and the supervisor's task running to handle it (a
    checkpoint away: ~30 ms on a loaded server), the status said RUNNING, and
    rt-serve's /health said 200 with the scheduler dead."""
    async with open_supervisor(quick_spec(ActorSpec("a", Idle))) as sup:
        pid = sup.status().actor("a").pid
        assert pid is not None and sup.status().actor("a").state is ActorState.RUNNING
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + TIMEOUT  # no checkpoint: no supervisor task runs
        while state_of(pid) != "Z":  # a zombie: dead, its exit not yet handled
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert sup.status().actor("a").state is ActorState.EXITING
        assert not sup.status().healthy
        await wait_until(sup, is_running("a", 2))


async def test_status_works_with_the_childrens_pidfds_past_1023() -> None:
    """A process holding more than 1024 fds (an app's sockets; rt-serve's
    connections when a child restarts): the status read each pidfd with
    select(), which raises for an fd past 1023, and every request failed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit of open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        async with open_supervisor(quick_spec(ActorSpec("a", Idle))) as sup:
            assert sup.status().actor("a").state is ActorState.RUNNING
            pid = sup.status().actor("a").pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            await wait_until(sup, is_running("a", 2))
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_crash_inside_a_nursery_is_named_by_its_innermost_exception() -> None:
    spec = quick_spec(ActorSpec("nested", RaisesInANursery, restart=Restart.TEMPORARY))
    async with open_supervisor(spec) as sup:
        status = await wait_until(sup, lambda s: s.actor("nested").state is ActorState.FAILED)
    # not "+------------------------------------", an exception group traceback's last line
    assert status.actor("nested").last_exit_reason == "exit code 1 (ValueError: boom)"


async def test_an_escalation_leaves_the_rings_open_until_the_body_has_exited() -> None:
    spec = quick_spec(
        ActorSpec("fwd", Forward, inboxes=("in",), outboxes=("out",)),
        ActorSpec("doomed", ExitAfter, kwargs={"code": 1, "delay": 0.5}),
        rings=(RingDecl("in", 4096), RingDecl("out", 4096)),
        max_restarts=0,
    )
    with pytest.raises(BaseExceptionGroup) as caught:
        with trio.fail_after(TIMEOUT):
            async with open_supervisor(spec) as sup:
                tx = RingSender.attach(sup.ring("in").spec)
                rx = RingReceiver.attach(sup.ring("out").spec)
                try:
                    await trio.sleep_forever()  # until the escalation cancels the body
                finally:
                    # The children are stopped by now; the rings must still be open:
                    # closing an end rings the peer's doorbell (an eventfd of the ring).
                    tx.close()
                    rx.close()
    assert caught.group_contains(EscalationError)
    assert not caught.group_contains(OSError)
    assert sup.status().escalated is not None


async def test_a_start_up_stuck_on_its_thread_is_given_up_long_before_its_startup_timeout() -> None:
    """A start-up that hangs on the child's trio thread stops its beats: it is killed
    and started again after a tenth of startup_timeout (the watchdog's timeout if
    longer); it was waited for startup_timeout: 600 s for the scheduler, with every
    new request held."""
    rule = {"actor": "a", "point": "startup", "action": "hang", "hang": "sleep", "incarnation": 2}
    plan = FaultPlan.from_dict({"seed": 1, "faults": [rule]})
    spec = quick_spec(ActorSpec("a", Idle, startup_timeout=60.0), watchdog_timeout=1.0)
    async with open_supervisor(spec, fault_plan=plan) as sup:
        os.kill(sup.status().actor("a").pid, signal.SIGKILL)  # type: ignore[arg-type]
        status = await wait_until(sup, is_running("a", 3))  # (6 s; TIMEOUT: 20 s, not 60)
    reason = status.actor("a").last_exit_reason or ""
    assert "stuck in its start-up: no heartbeat for" in reason, reason

"""Why a request could not complete now: what ``/health`` answers, and
``rt.testing.wait_healthy`` waits for on an engine of the caller's own."""

from __future__ import annotations

from typing import Any

from rt.actors import ActorState
from rt.actors.status import SILENT_AFTER_S, ActorStatus, seen_down
from rt.frontend.wiring import SCHEDULER

SUSPENDED = "suspended"  # rt's word for an actor stopped by a signal (SIGSTOP)


def unhealthy(engine: Any) -> str | None:
    """Why a request ``engine`` takes could not complete now, or None: it stops, it
    gave up, an actor is down (as its supervisor sees it, or as the kernel does
    before), the scheduler's step runs past half the watchdog's timeout, an actor
    shows no sign of life, or the suspects of a repeat crash are being told apart
    (new requests wait meanwhile)."""
    if getattr(engine, "stopped_by", None) is not None:
        return f"the server is shutting down ({engine.stopped_by})"
    status = engine.supervisor.status()
    if status.escalated:
        return f"the engine gave up: {status.escalated}"
    down = [a for a in status.actors if a.state is not ActorState.RUNNING]
    if down or not status.running:
        return (
            "; ".join(
                f"{a.name} is {a.state.value}"
                + (f" (last exit: {a.last_exit_reason})" if a.last_exit_reason else "")
                for a in down
            )
            or "the supervisor is not running"
        )
    seen = [(a.name, how) for a in status.every_actor() if (how := _seen_down(a))]
    if seen:  # killed or stopped, not seen by the supervisor yet (see seen_down)
        return "; ".join(f"{name} is {_word(how)}" for name, how in seen)
    sched = status.actor(SCHEDULER)  # (a step that hangs: its trio thread beats on;
    # past half the watchdog's budget: a CPU step of 10 s is no hang)
    stuck_after = max(SILENT_AFTER_S, engine.options.watchdog_timeout / 2)
    if sched.handling_age is not None and sched.handling_age > stuck_after:
        return (
            f"the scheduler's step has run for {sched.handling_age:.1f} s (stuck or slow; "
            "the watchdog restarts it if it does not end)"
        )
    silent = status.silent()
    if silent:
        return "; ".join(
            f"{a.name} has shown no sign of life for {a.beat_age:.1f} s (stopped or stuck; "
            "the watchdog restarts it if it does not come back)"
            for a in silent
        )
    if engine.table.isolating:
        return (
            "the scheduler crashed again with the same requests in flight: new requests "
            "wait while it is found which of those requests crashes it"
        )
    return None


def _seen_down(actor: ActorStatus) -> str | None:
    if actor.state is not ActorState.RUNNING or actor.pid is None:
        return None
    return seen_down(actor.pid)


def _word(seen: str) -> str:
    """The kernel's word for a process down, as rt says it: "stopped" by a signal is
    "suspended" (the supervisor's "stopped" is an actor it will not start again)."""
    return SUSPENDED if seen == "stopped" else seen


def state_of(actor: ActorStatus) -> str:
    """``actor``'s state as /server_info tells it: its supervisor's, or the kernel's
    when that is newer: "suspended" from a SIGSTOP on (it said "running"; not
    "stopped", the supervisor's word for an actor it will not start again), or
    "exiting" once a SIGKILL is pending."""
    seen = _seen_down(actor)
    return actor.state.value if seen is None else _word(seen)

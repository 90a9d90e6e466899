"""The supervisor's state as frozen snapshots, for /server_info, /health, /metrics."""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass


class ActorState(enum.StrEnum):
    STARTING = "starting"  # spawned, not yet reported ready
    RUNNING = "running"  # reported ready, not exited
    EXITING = "exiting"  # its run raised (or ended): going down, the exit not seen yet
    RESTARTING = "restarting"  # exited (or stopped by its strategy); will start again
    STOPPED = "stopped"  # exited normally and is not restarted, or the supervisor stopped
    FAILED = "failed"  # exited abnormally and is not restarted (temporary, or escalation)


@dataclass(frozen=True)
class ActorStatus:
    """One child. Times are ``time.monotonic()`` seconds; ``heartbeat_age`` is
    how long the child has made no progress: since its last beat, or since it
    took the requests it has in hand (None: not running; see
    :mod:`rt.actors.heartbeat`). ``last_exit_at`` is the previous exit's while
    the state is EXITING.
    ``request_crashes`` counts the abnormal exits charged to the requests the
    child had in hand: restarted, but not counted toward escalation.
    ``beat_age`` is the time since its last beat alone, requests in hand or
    not: its trio thread beats at least every second while the process runs
    (long work runs on a worker thread), so past ``SILENT_AFTER_S`` the process is
    stopped (SIGSTOP) or its trio thread is stuck, long before the watchdog
    kills it."""

    name: str
    pid: int | None
    state: ActorState
    incarnation: int  # 1 for the first start, +1 for each restart
    restart_count: int
    last_exit_reason: str | None
    heartbeat_age: float | None
    ready_at: float | None  # when the current incarnation reported ready
    last_exit_at: float | None  # when the supervisor saw the last exit
    request_crashes: int = 0
    beat_age: float | None = None  # since its last beat alone (None: not running)
    # since it took the requests it has in hand (None: none, or not running); unlike
    # heartbeat_age, not cut at ready_at: work that began as it started is this one's
    handling_age: float | None = None


SILENT_AFTER_S = 5.0  # a running child with no beat for this long cannot answer
_SIGKILL_BIT, _SIGSTOP_BIT = 1 << (signal.SIGKILL - 1), 1 << (signal.SIGSTOP - 1)


def seen_down(pid: int) -> str | None:
    """How process ``pid`` is down, as the kernel tells it now, before the supervisor
    can see it: "exiting" (a SIGKILL pending, its main thread a zombie, or gone: its
    pidfd is readable only once every thread has gone, 160 ms later for a process
    holding 800 MB), "stopped" (SIGSTOP: its beat would show it only after
    SILENT_AFTER_S); None if neither, or unknown. /health asks, so that it never
    says 200 in those windows."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):  # reaped
        return "exiting"
    except OSError:  # unknown (out of fds, say): not a reason to call it down
        return None
    fields = dict(line.split(b":", 1) for line in text.splitlines() if b":" in line)
    state = fields.get(b"State", b"").strip()[:1]
    pending = 0
    for key in (b"ShdPnd", b"SigPnd"):
        pending |= int(fields.get(key, b"0").strip() or b"0", 16)
    if state in (b"Z", b"X") or pending & _SIGKILL_BIT:
        return "exiting"
    # (not "t", a tracing stop: strace or py-spy attached, a pause of microseconds)
    return "stopped" if state == b"T" or pending & _SIGSTOP_BIT else None


@dataclass(frozen=True)
class SupervisorStatus:
    """One supervisor. A child subtree appears in ``actors`` (pid None) and, in
    full, in ``subtrees``."""

    name: str
    strategy: str
    actors: tuple[ActorStatus, ...]
    running: bool  # every child was started and the supervisor is not stopping
    restarts_in_window: int
    escalated: str | None  # the escalation message once the run has given up
    subtrees: tuple[SupervisorStatus, ...] = ()

    def actor(self, name: str) -> ActorStatus:
        """The actor (or subtree) called ``name``, anywhere in the tree."""
        for status in self.actors:
            if status.name == name:
                return status
        for subtree in self.subtrees:
            try:
                return subtree.actor(name)
            except KeyError:
                continue
        raise KeyError(f"no actor named {name!r}; actors: {[a.name for a in self.actors]}")

    def every_actor(self) -> list[ActorStatus]:
        """The actors (and subtrees) at every level."""
        return [*self.actors, *(a for s in self.subtrees for a in s.every_actor())]

    def silent(self) -> list[ActorStatus]:
        """The running actors, at every level, with no beat for ``SILENT_AFTER_S``."""
        return [
            a for a in self.every_actor() if a.beat_age is not None and a.beat_age > SILENT_AFTER_S
        ]

    @property
    def settled(self) -> bool:
        """Escalated, or every actor at every level has been up (or failed for good):
        one whose first start failed is being started again."""
        ended = (ActorState.FAILED, ActorState.STOPPED)
        return self.escalated is not None or all(
            a.ready_at is not None or a.state in ended for a in self.every_actor()
        )

    @property
    def healthy(self) -> bool:
        """Running, and every actor that should be running is running, at every level."""
        return (
            self.running
            and all(a.state in (ActorState.RUNNING, ActorState.STOPPED) for a in self.actors)
            and all(s.healthy for s in self.subtrees if s.running)
        )

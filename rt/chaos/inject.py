"""Firing the schedule's signal faults from outside, each at its phase.

The injector takes the signal faults in order: it waits ``wait_s``, then for
the load to be in the fault's phase (at most ``PHASE_WAIT_S``; it fires
anyway after that, and the ledger records the phase it observed), then
signals the actor's pid:

* idle: the load pauses until nothing is in flight;
* prefill: a request is waiting for its first token;
* decode: tokens are flowing; stream: a request has had two deltas or more;
* restart: an actor is down (the previous fault's): the target is killed
  then, or, when it is the one restarting, as soon as its successor runs;
* backlog: tokens are flowing; the actor that reads the target's output
  (``DOWNSTREAM``) is stopped for the fault's ``stop_s`` (drawn; else
  ``BACKLOG_S``), the target is signalled with its frames unread there, and
  the reader continues: at once for a tokenizer, and for a scheduler once its
  successor runs (plus ``TAKEOVER_S``; at most ``hold_s`` after the reader
  stopped). A scheduler killed this way leaves tokens its successor computes
  again (in bfloat16, maybe differently) and that reach the frontend after
  the successor took over: the splice checker's case.

SIGSTOP stops the actor for ``stop_s`` then SIGCONT, or leaves it to the
watchdog; every pid stopped is continued when the injector ends, dead or not.
"""

from __future__ import annotations

import contextlib
import os
import signal

import trio

from rt.chaos.ledger import Ledger
from rt.chaos.load import LiveState, Load
from rt.chaos.monitor import Monitor
from rt.chaos.schedule import Fault, role

SIGNALS = {"sigkill": signal.SIGKILL, "sigsegv": signal.SIGSEGV, "sigstop": signal.SIGSTOP}
PHASE_WAIT_S = 15.0
PID_WAIT_S = 60.0
BACKLOG_S = 0.3
TAKEOVER_S = 0.2  # after a backlog's target is running again: its successor resumes
DOWNSTREAM = {"scheduler": "detokenizer", "tokenizer": "scheduler"}

CONDITIONS = {
    "prefill": lambda live: any(r.tokens == 0 for r in live.requests.values()),
    "decode": lambda live: any(r.tokens > 0 for r in live.requests.values()),
    "stream": lambda live: any(r.deltas >= 2 for r in live.requests.values()),
}


class Injector:
    """``hold_s``: the longest a backlog's reader stays stopped (under the watchdog's
    timeout, or the reader would be killed as hung)."""

    def __init__(self, load: Load, monitor: Monitor, ledger: Ledger, hold_s: float = 2.0) -> None:
        self.load, self.monitor, self.ledger = load, monitor, ledger
        self.hold_s = hold_s
        self.stopped: list[int] = []

    @property
    def live(self) -> LiveState:
        return self.load.live

    async def run(self, faults: list[Fault]) -> None:
        """Fire ``faults`` in order. Stopped actors stay stopped: :meth:`release`."""
        for fault in faults:
            await trio.sleep(fault.wait_s)
            if self.load.finished.is_set():
                self.ledger.write("note", what=f"fault #{fault.id} not fired: the load ended")
                continue
            await self.at_phase(fault)

    async def at_phase(self, fault: Fault) -> None:
        if fault.phase == "idle":
            with trio.move_on_after(PHASE_WAIT_S):
                await self.load.idle()
            try:
                await self.fire(fault, "idle" if not self.live.requests else self.live.phase())
            finally:
                self.load.resume()
            return
        if fault.phase == "restart":
            await self._at_restart(fault)
            return
        if fault.phase == "backlog":
            await self._with_backlog(fault)
            return
        condition = CONDITIONS.get(fault.phase)
        if condition is not None:
            with trio.move_on_after(PHASE_WAIT_S):
                await self.live.wait_for(condition)
        await self.fire(fault, self.live.phase())

    async def _at_restart(self, fault: Fault) -> None:
        def down(m: Monitor) -> bool:
            # (restarting; not a suspended one: SIGSTOP, which a restart may follow)
            return any(a.state not in ("running", "suspended") for a in m.actors.values())

        with trio.move_on_after(PHASE_WAIT_S):
            await self.monitor.wait_for(down)
        await self.fire(fault, "restart" if down(self.monitor) else self.live.phase())

    async def _with_backlog(self, fault: Fault) -> None:
        with trio.move_on_after(PHASE_WAIT_S):
            await self.live.wait_for(CONDITIONS["decode"])
        reader = DOWNSTREAM.get(role(fault.actor))
        target = await self.pid(fault.actor)  # first: the reader must not wait stopped
        pid = await self.pid(reader) if reader is not None and target is not None else None
        if pid is None:  # nobody reads its output through a ring (the detokenizer)
            await self.fire(fault, self.live.phase())
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        self.ledger.write("note", what=f"fault #{fault.id}: {reader} ({pid}) stopped: a backlog")
        stopped_at = trio.current_time()
        try:
            backlog = fault.stop_s if fault.kind != "sigstop" and fault.stop_s else BACKLOG_S
            await trio.sleep(backlog)
            await self.fire(fault, "backlog", target)
            if fault.crash and role(fault.actor) == "scheduler":
                # the reader must meet the dead run's frames only once a successor took
                # over (resumed from what the frontend held): continued at once, it read
                # them first, as the dead run's own, and nothing was computed again. (A
                # tokenizer's reader, the scheduler, is continued at once: a stopped
                # step with requests in hand would soon count as a hang.)
                with trio.move_on_at(stopped_at + self.hold_s):
                    await self._successor(fault.actor, target)
                    await trio.sleep(TAKEOVER_S)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.ledger.write("note", what=f"fault #{fault.id}: {reader} ({pid}) continued")

    async def _successor(self, actor: str, dead: int | None) -> None:
        """Wait until ``actor`` runs again, in another process than ``dead``."""
        await self.monitor.wait_for(
            lambda m: (
                actor in m.actors
                and m.actors[actor].state == "running"
                and m.actors[actor].pid not in (None, dead)
            )
        )

    async def pid(self, actor: str) -> int | None:
        """The actor's pid once it is running (its successor's, if it is restarting)."""
        with trio.move_on_after(PID_WAIT_S):
            await self.monitor.wait_for(
                lambda m: (
                    actor in m.actors
                    and m.actors[actor].state == "running"
                    and m.actors[actor].pid is not None
                )
            )
        info = self.monitor.actors.get(actor)
        return info.pid if info is not None and info.state == "running" else None

    async def fire(self, fault: Fault, observed: str, pid: int | None = None) -> None:
        pid = pid or await self.pid(fault.actor)
        if pid is None:
            self.ledger.write("note", what=f"fault #{fault.id}: {fault.actor} never ran; not fired")
            return
        self.ledger.write(
            "fault",
            id=fault.id,
            kind=fault.kind,
            actor=fault.actor,
            via="signal",
            pid=pid,
            phase=fault.phase,
            observed=observed,
            crash=fault.crash,
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, SIGNALS[fault.kind])
        if fault.kind == "sigstop":
            self.stopped.append(pid)
            if fault.stop_s is not None:
                await trio.sleep(fault.stop_s)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                self.ledger.write("note", what=f"fault #{fault.id}: SIGCONT to {pid}")

    def release(self) -> None:
        for pid in self.stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.stopped.clear()

"""Watching the engine while the load runs: actor states, health, planned faults.

Every ``interval`` the monitor samples the target and writes an ``actor``
event for each change (state, incarnation, pid; with the supervisor's exit
time when it is known) and a ``health`` event when the health answer
changes. A fault of the plan fires inside an actor, which says so on its
stderr (``rt.actors.faults: fault plan rule N: ...``, written and flushed
before it acts): the lines arrive through a :class:`StderrTap` (in-process)
or the rt-serve subprocess's stderr, with the time they were read, and
become ``fault`` events.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import trio

from rt.chaos.ledger import Ledger
from rt.chaos.load import LiveState
from rt.chaos.schedule import Fault
from rt.chaos.targets import ActorInfo, Target

FAULT_LINE = re.compile(
    r"rt\.actors\.faults: fault plan rule (\d+): (\w+) at point '([^']*)' of actor "
    r"'([^']*)' \(incarnation (\d+), hit (\d+)\)"
)
Lines = deque[tuple[float, str]]  # (time.monotonic() when read, line)


class Monitor:
    def __init__(
        self,
        target: Target,
        ledger: Ledger,
        live: LiveState,
        plan_faults: list[Fault],
        lines: Lines | None = None,
        interval: float = 0.025,
    ) -> None:
        self.target, self.ledger, self.live = target, ledger, live
        self.plan_faults, self.lines, self.interval = plan_faults, lines, interval
        self.actors: dict[str, ActorInfo] = {}
        self.health: bool | None = None
        self.changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.sample()
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            await self.sample()

    async def sample(self) -> None:
        self.drain_lines()
        try:
            actors, healthy = await self.target.actors(), await self.target.healthy()
        except Exception as err:  # a server that stopped answering: the run sees it
            self.ledger.write("note", what=f"monitor: {type(err).__name__}: {err}"[:300])
            return
        changed = False
        for a in actors:
            old = self.actors.get(a.name)
            if old is None or (old.state, old.incarnation, old.pid) != (
                a.state,
                a.incarnation,
                a.pid,
            ):
                event: dict[str, Any] = {"name": a.name, "state": a.state, "incarnation": a.incarnation,
                         "pid": a.pid, "restarts": a.restarts, "reason": a.reason}  # fmt: skip
                # an exiting actor has not exited yet: its last exit time is the one before
                if a.state not in ("running", "exiting", "suspended") and a.exit_at is not None:
                    event["exit_at"] = round(self.ledger.at(a.exit_at), 6)
                self.ledger.write("actor", **event)
                changed = True
            self.actors[a.name] = a
        if healthy != self.health:
            self.ledger.write("health", ok=healthy)
            self.health = healthy
            changed = True
        if changed:
            self.changed.set()
            self.changed = trio.Event()

    def drain_lines(self) -> None:
        record_fault_lines(self.ledger, self.lines, self.plan_faults, self.live.phase())

    async def wait_for(self, condition: object) -> None:
        """Until ``condition(self)`` holds (checked at every change)."""
        assert callable(condition)
        while not condition(self):
            await self.changed.wait()


def record_fault_lines(
    ledger: Ledger, lines: Lines | None, plan_faults: list[Fault], observed: str
) -> None:
    """A ``fault`` event for each fault line in ``lines`` (which it empties)."""
    while lines:
        at, line = lines.popleft()
        match = FAULT_LINE.search(line)
        if match is None:
            continue
        rule, action, point, actor, incarnation, hit = match.groups()
        fault = plan_faults[int(rule)] if int(rule) < len(plan_faults) else None
        ledger.write(
            "fault",
            t=ledger.at(at),
            id=fault.id if fault else None,
            kind=fault.kind if fault else action,
            actor=actor,
            via="plan",
            point=point,
            hit=int(hit),
            incarnation=int(incarnation),
            phase=fault.phase if fault else None,
            observed=observed,
            crash=fault.crash if fault else action not in ("delay", "drop", "duplicate", "corrupt"),
        )


class StderrTap:
    """This process's fd 2 through a pipe: each line is timestamped into ``lines``
    and copied to ``sink``. Children started meanwhile inherit the pipe, so the
    lines rt's actors write (their faults firing) come through it too."""

    def __init__(self, sink: IO[bytes]) -> None:
        self.lines: Lines = deque()
        self._sink = sink

    @contextmanager
    def installed(self) -> Iterator[Lines]:
        read, write = os.pipe()
        saved = os.dup(2)
        os.dup2(write, 2)
        os.close(write)
        thread = threading.Thread(target=self._pump, args=(read,), daemon=True)
        thread.start()
        try:
            yield self.lines
        finally:
            os.dup2(saved, 2)  # our write end goes; EOF once every child's has gone
            os.close(saved)
            thread.join(10)

    def _pump(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            for raw in pipe:
                self.lines.append((time.monotonic(), raw.decode(errors="replace")))
                self._sink.write(raw)
                self._sink.flush()

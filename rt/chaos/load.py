"""The load generator: requests ``0, 1, 2, …`` of a workload, ``concurrency`` at a
time, until ``requests`` were sent or ``duration`` seconds passed; then it
waits for those in flight. Given ``until``, a count goes on past ``requests``
(up to ``MOST`` times as many) until that event is set: the injector's faults
then fire under load however fast the engine serves. It can pause (the
injector asks for an idle engine) and it tells the injector what is in flight
(phase conditions).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from rt.chaos.workload import RequestSpec

MOST = 4  # with ``until``: at most this many times ``requests``


@dataclass
class InFlight:
    invoked_at: float
    tokens: int = 0
    deltas: int = 0


@dataclass
class LiveState:
    """Requests in flight, by index (the transports keep it current)."""

    requests: dict[int, InFlight] = field(default_factory=dict)
    sent: int = 0
    changed: trio.Event = field(default_factory=trio.Event)

    def started(self, index: int) -> None:
        self.requests[index] = InFlight(time.monotonic())
        self.sent += 1
        self._notify()

    def got(self, index: int, tokens: int) -> None:
        req = self.requests.get(index)
        if req is not None:
            req.tokens += tokens
            req.deltas += 1
            self._notify()

    def ended(self, index: int) -> None:
        self.requests.pop(index, None)
        self._notify()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, condition: Callable[[LiveState], bool]) -> None:
        while not condition(self):
            await self.changed.wait()

    def phase(self) -> str:
        """The load's phase now: idle; prefill (a request waits for its first
        token), stream (tokens are flowing), or both ("prefill+stream")."""
        waiting = any(r.tokens == 0 for r in self.requests.values())
        flowing = any(r.tokens > 0 for r in self.requests.values())
        return "+".join(p for p, on in (("prefill", waiting), ("stream", flowing)) if on) or "idle"


class Load:
    def __init__(
        self,
        draw: Callable[[int], RequestSpec],
        run: Callable[[RequestSpec], Awaitable[object]],
        concurrency: int,
        requests: int | None = None,
        duration: float | None = None,
        until: trio.Event | None = None,
    ) -> None:
        self.draw, self.run = draw, run
        self.concurrency = concurrency
        self.requests = requests if requests is not None else math.inf
        self.duration = duration if duration is not None else math.inf
        self.until = until
        self.live = LiveState()
        self._paused = 0
        self._resumed = trio.Event()
        self.finished = trio.Event()

    async def idle(self) -> None:
        """Pause the load and wait until nothing is in flight; call :meth:`resume` after."""
        self._paused += 1
        await self.live.wait_for(lambda live: not live.requests)

    def resume(self) -> None:
        self._paused -= 1
        if not self._paused:
            self._resumed.set()
            self._resumed = trio.Event()

    async def __call__(self) -> None:
        slots = trio.Semaphore(self.concurrency)
        deadline = trio.current_time() + self.duration
        index = 0

        async def one(spec: RequestSpec) -> None:
            try:
                await self.run(spec)
            finally:
                slots.release()

        async with trio.open_nursery() as nursery:
            while self._more(index) and trio.current_time() < deadline:
                await slots.acquire()
                while self._paused:
                    await self._resumed.wait()
                if trio.current_time() >= deadline or not self._more(index):
                    slots.release()
                    break
                nursery.start_soon(one, self.draw(index))
                index += 1
                await trio.lowlevel.checkpoint()
        self.finished.set()

    def _more(self, index: int) -> bool:
        if index < self.requests:
            return True
        return self.until is not None and not self.until.is_set() and index < MOST * self.requests

"""Stopping the engine on SIGTERM, SIGINT or SIGHUP (the terminal closing), in
its caller's main thread.

New requests are refused at once (EngineShutdownError); those in flight get up
to ``drain_timeout`` seconds to finish (generation paused by the operator is
resumed for them). A second signal ends that wait at once
(an operator's "now"). What is still in flight then fails with
EngineShutdownError, and its callers get a moment to answer it (an SSE error
event, a WebSocket error frame) before the ``async with`` body is cancelled: a
request cut off by a stop always ends with an error its client can read,
never with a connection that just drops.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from rt.frontend.engine import Engine

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FAREWELL_S = 2.0  # how long callers get to write the refusal of what was cut off
POLL_S = 0.05


class _Hub:
    """One signal receiver for every engine of a trio run, from the first engine's
    opening to the last one's closing, handing each signal to every engine open.
    (A receiver each: trio puts back the handlers a receiver replaced when it
    closes, so two engines closed in the order they opened left the second
    one deaf, Ctrl-C a KeyboardInterrupt in its body, and a stale handler
    behind that swallowed the next signal.)"""

    def __init__(self) -> None:
        self.engines: set[trio.MemorySendChannel[int]] = set()
        self.running = False
        self.left = trio.Event()  # an engine left: maybe the last

    @contextmanager
    def subscribed(self) -> Iterator[trio.MemoryReceiveChannel[int]]:
        send, receive = trio.open_memory_channel[int](math.inf)
        self.engines.add(send)
        if not self.running:
            self.running = True
            trio.lowlevel.spawn_system_task(self._receive)
        try:
            yield receive
        finally:
            self.engines.discard(send)
            self.left.set()

    async def _receive(self) -> None:
        while self.engines:
            with trio.open_signal_receiver(*SIGNALS) as signals:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._until_none_left, nursery.cancel_scope)
                    async for signum in signals:
                        for send in list(self.engines):
                            with contextlib.suppress(trio.BrokenResourceError):
                                send.send_nowait(signum)
        self.running = False  # (no checkpoint since the last one left)

    async def _until_none_left(self, scope: trio.CancelScope) -> None:
        while self.engines:
            await self.left.wait()
            self.left = trio.Event()
        scope.cancel()


_HUB = trio.lowlevel.RunVar[_Hub]("rt_signal_hub")


def _signals() -> contextlib.AbstractContextManager[trio.MemoryReceiveChannel[int]]:
    try:
        hub = _HUB.get()
    except LookupError:
        hub = _Hub()
        _HUB.set(hub)
    return hub.subscribed()


async def stop_on_signal(engine: Engine, cancel_scope: trio.CancelScope) -> None:
    """The first signal drains ``engine``, then cancels ``cancel_scope``."""
    with _signals() as signals:
        name = signal.Signals(await signals.__anext__()).name
        engine.stopped_by = name
        engine.refusing = True  # those given up on meanwhile are still aborted
        live = len(engine.table.live())
        log.warning(
            "%s: draining %s for at most %g s (a second signal stops at once)",
            name,
            f"{live} request(s)"
            if live or not engine.held
            else "no request in flight (answers clients are still taking, or requests "
            "waiting for an actor to come back)",
            engine.options.drain_timeout,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cut_short_on_signal, signals, nursery.cancel_scope)
            if engine.paused:  # what is in flight could never finish
                log.warning("generation was paused: resumed for the drain")
                nursery.start_soon(engine.continue_generation)
            with trio.move_on_after(engine.options.drain_timeout):
                while engine.table.live() or engine.held:
                    await trio.sleep(POLL_S)
            nursery.cancel_scope.cancel()
        late = len(engine.table.live())
        if late:
            log.warning("%d request(s) still in flight: failing them", late)
            engine.refuse_live(f"the engine stopped ({name}) before the request finished")
            with trio.move_on_after(FAREWELL_S):
                while engine.held:
                    await trio.sleep(POLL_S)
        cancel_scope.cancel()


async def _cut_short_on_signal(signals: AsyncIterator[int], drain: trio.CancelScope) -> None:
    name = signal.Signals(await signals.__anext__()).name
    log.warning("%s again: stopping now", name)
    drain.cancel()

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

import logging
import signal
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from rt.frontend.engine import Engine

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FAREWELL_S = 2.0  # how long callers get to write the refusal of what was cut off
POLL_S = 0.05


async def stop_on_signal(engine: Engine, cancel_scope: trio.CancelScope) -> None:
    """The first signal drains ``engine``, then cancels ``cancel_scope``."""
    with trio.open_signal_receiver(*SIGNALS) as signals:
        name = signal.Signals(await signals.__anext__()).name
        engine.stopped_by = name
        engine.refusing = True  # those given up on meanwhile are still aborted
        log.warning(
            "%s: draining %d request(s) for at most %g s (a second signal stops at once)",
            name,
            len(engine.table.live()),
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

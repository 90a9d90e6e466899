"""rt.testing: crash, stop and check rt from your own tests (pytest-trio friendly).

    import rt.testing as rtt

    async def test_a_dead_detokenizer_loses_nothing():
        with rtt.no_leaks():                                   # processes, segments, fds
            async with rtt.open_engine(faults=[rtt.crash("scheduler", "step", after=20)]) as engine:
                ledger = rtt.Ledger()
                out = await rtt.send(engine, ledger, "In the beginning", max_new_tokens=32)
                await rtt.kill_actor(engine, "detokenizer")
                await rtt.wait_healthy(engine)
                assert await rtt.restart_count(engine, "detokenizer") == 1
                await rtt.send(engine, ledger, "And God said", max_new_tokens=8)
                rtt.assert_terminal(ledger)                    # each request: one terminal state

``open_server(...)`` starts a real ``rt-serve`` subprocess instead (127.0.0.1,
a free port) and yields a :class:`Server`; every helper takes either.
"""

from __future__ import annotations

from rt.chaos.ledger import Ledger
from rt.chaos.transports import End
from rt.testing.actors import (
    actor_pid,
    continue_actor,
    kill_actor,
    restart_count,
    stop_actor,
    wait_healthy,
    wait_restarted,
)
from rt.testing.checks import assert_no_leaks, assert_terminal, no_leaks, send
from rt.testing.engines import Server, crash, open_engine, open_server

__all__ = [
    "End",
    "Ledger",
    "Server",
    "actor_pid",
    "assert_no_leaks",
    "assert_terminal",
    "continue_actor",
    "crash",
    "kill_actor",
    "no_leaks",
    "open_engine",
    "open_server",
    "restart_count",
    "send",
    "stop_actor",
    "wait_healthy",
    "wait_restarted",
]

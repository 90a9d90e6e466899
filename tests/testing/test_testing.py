"""rt.testing against a real engine and a real rt-serve (the null model: no
forward pass, so the processes and rings are all that is tested)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import rt.testing as rtt

NULL = {"load_format": "null", "max_total_tokens": 4096, "watchdog_timeout": 2.0}


@pytest.mark.slow
async def test_kill_stop_wait_and_count_on_an_engine() -> None:
    with rtt.no_leaks():
        plan = [rtt.crash("scheduler", "step", after=3)]
        async with rtt.open_engine(faults=plan, **NULL) as engine:
            ledger = rtt.Ledger()
            first = await rtt.send(engine, ledger, "In the beginning", max_new_tokens=12)
            assert first.state == "completed" and len(first.ids) == 12
            assert await rtt.restart_count(engine, "scheduler") == 1  # the planned crash
            # the README's sequence: healthy once the death is seen and the actor back
            # (wait_healthy returned at once, before the supervisor saw the kill)
            await rtt.kill_actor(engine, "detokenizer")
            await rtt.wait_healthy(engine)
            assert await rtt.restart_count(engine, "detokenizer") == 1
            pid = await rtt.stop_actor(engine, "tokenizer0")  # a hang: the watchdog's
            await rtt.wait_restarted(engine, "tokenizer0", restarts=1, timeout=60)
            rtt.continue_actor(pid)  # gone already: no error
            # (400 tokens: 50 came in two chunks to a reader behind under the full suite,
            # and the request ended before its cancel)
            cancelled = await rtt.send(
                engine, ledger, "And God said", max_new_tokens=400, cancel_after=2
            )
            assert cancelled.state == "cancelled"
            rtt.assert_terminal(ledger)
            assert len(ledger.requests()) == 2


async def test_assert_terminal_names_what_never_ended() -> None:
    ledger = rtt.Ledger()
    ledger.write("invoke", req=7, spec={})
    with pytest.raises(AssertionError, match="request 7: lost"):
        rtt.assert_terminal(ledger)


@pytest.mark.slow
async def test_an_rt_serve_subprocess_with_a_fault_plan() -> None:
    plan = [rtt.crash("detokenizer", "receive", after=5)]
    with rtt.no_leaks() as before:
        async with rtt.open_server("--load-format", "null", faults=plan) as server:
            ledger = rtt.Ledger()
            end = await rtt.send(server, ledger, "In the beginning", max_new_tokens=16)
            assert end.state == "completed" and len(end.ids) == 16
            with trio.fail_after(60):
                await rtt.wait_restarted(server, "detokenizer", restarts=1)
            await rtt.kill_actor(server, "scheduler")
            await rtt.wait_healthy(server)
            assert await rtt.restart_count(server, "scheduler") == 1
            assert (await rtt.send(server, ledger, "again", max_new_tokens=4)).state == "completed"
            rtt.assert_terminal(ledger)
            assert await server.stop() == 0
            root = server.pid
        rtt.assert_no_leaks(before, root_pids=[root])
    # no_leaks checks the segments of an rt-serve its body started (it looked at this
    # process's alone: a server's leak passed, unseen)
    left = Path(f"/dev/shm/rt_{root}_left_behind")
    try:
        with pytest.raises(AssertionError, match=r"rt_\d+_left_behind"), rtt.no_leaks(settle_s=0.5):
            async with rtt.open_server("--load-format", "null") as server:
                left = Path(f"/dev/shm/rt_{server.pid}_left_behind")
                left.touch()
    finally:
        left.unlink(missing_ok=True)

"""The frontend's bookkeeping: one sender per ring (callers wait their turn),
the caller's rids, and nothing outliving its request. Real processes and rings."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio
from enginelib import NULL, collect, plan

import rt
from rt.errors import InvalidRequestError, RequestAborted

# ---- one sender per ring ----------------------------------------------------------------


async def test_callers_wait_their_turn_on_a_full_tokenizer_ring(tmp_path: Path) -> None:
    """24 callers submit while the tokenizer stalls and its 4 KiB ring fills: they
    wait (backpressure); none gets BusyResourceError or WouldBlock (19 of 24 did)."""
    rule = {"actor": "tokenizer0", "point": "receive", "action": "delay", "delay_ms": 500}
    async with rt.open_engine(
        fault_plan=plan(tmp_path, rule), ring_capacity=4096, **NULL
    ) as engine:
        outs: list[Any] = []

        async def one(i: int) -> None:
            prompt = "And God said, Let there be light: and there was light. " * 8 + str(i)
            outs.append(await engine.generate(prompt, max_new_tokens=2))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(24):
                    nursery.start_soon(one, i)
        assert len(outs) == 24 and all(len(o.output_ids) == 2 for o in outs)


async def test_a_full_frontend_ring_is_backpressure_for_the_detokenizer() -> None:
    """The frontend lags (its loop blocked now and then) and the detokenizer's ring
    to it fills: the detokenizer waits. It used to crash (two tasks sending)."""
    async with rt.open_engine(ring_capacity=4096, max_restarts=0, **NULL) as engine:
        counts: list[int] = []

        async def one(i: int) -> None:
            _, ids = await collect(engine, f"prompt {i}", max_new_tokens=60, ignore_eos=True)
            counts.append(len(ids))

        async def hog() -> None:
            while True:
                time.sleep(0.2)  # the frontend's trio loop is blocked
                await trio.sleep(0.05)

        with trio.fail_after(90):
            async with trio.open_nursery() as outer:
                outer.start_soon(hog)
                async with trio.open_nursery() as nursery:
                    for i in range(80):
                        nursery.start_soon(one, i)
                outer.cancel_scope.cancel()
        assert counts == [60] * 80
        assert all(a.restart_count == 0 for a in engine.actors())


# ---- rids ----------------------------------------------------------------------------------


async def test_a_rid_is_free_again_once_its_request_finished() -> None:
    async with rt.open_engine(**NULL) as engine:
        first = await engine.generate("hello", rid="job-1", max_new_tokens=4)
        with trio.fail_after(30):
            again = await engine.generate("hello again", rid="job-1", max_new_tokens=4)
        assert first.rid == again.rid == "job-1"
        assert len(again.output_ids) == 4

        stream = engine.stream("long", rid="busy", max_new_tokens=200, ignore_eos=True)
        await stream.__anext__()
        with pytest.raises(InvalidRequestError, match=r"busy.*already in flight"):
            await engine.generate("clash", rid="busy", max_new_tokens=2)
        # aborted, or ended, though its caller has not read the end: free again at once
        # (it was refused until then: an RL loop aborts and retries under the same rid)
        assert engine.abort("busy")
        retry = await engine.generate("retry", rid="busy", max_new_tokens=3)
        assert len(retry.output_ids) == 3
        with pytest.raises(RequestAborted):
            async for _ in stream:
                pass
        greedy: dict[str, Any] = dict(max_new_tokens=2, ignore_eos=True, temperature=0)
        done = engine.stream("short", rid="done", **greedy)
        first = await done.__anext__()
        with trio.fail_after(30):
            while "done" in engine.rids:
                await trio.sleep(0.01)
        again = await engine.generate("short", rid="done", **greedy)
        rest = [chunk async for chunk in done]
        ids = [*first.output_ids, *(t for chunk in rest for t in chunk.output_ids)]
        assert ids == list(again.output_ids)  # its own output, read to its end
        assert not engine.abort("done")
        # a loop left with break: its stream dropped, the rid is free at once (it was
        # refused until trio's next tick, when the dropped stream's abort runs)
        async for _ in engine.stream("long", rid="left", max_new_tokens=200, ignore_eos=True):
            break
        left = await engine.generate("again", rid="left", max_new_tokens=2)
        assert len(left.output_ids) == 2


async def test_client_rids_never_share_a_stream(tiny_model) -> None:
    """A client's rid "job/1" used to share the detokenizer stream of rid "job"'s
    second sample: a hang, or one client reading the other's text."""
    greedy: dict[str, Any] = dict(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    async with rt.open_engine(str(tiny_model), **NULL) as engine:
        alone_a = await engine.generate("And God said", **greedy)
        alone_b = await engine.generate("In the beginning", **greedy)
        res: dict[str, Any] = {}

        async def a() -> None:
            res["job"] = await engine.generate("And God said", rid="job", n=2, **greedy)

        async def b() -> None:
            res["job/1"] = await engine.generate("In the beginning", rid="job/1", **greedy)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a)
                nursery.start_soon(b)
    assert [c.text for c in res["job"].choices] == [alone_a.text] * 2
    assert res["job/1"].text == alone_b.text and res["job/1"].rid == "job/1"


# ---- nothing outlives its request ------------------------------------------------------------


@pytest.mark.slow
async def test_three_thousand_cancelled_requests_leave_no_state_behind() -> None:
    """Tokens of a cancelled stream that reach the detokenizer after its close used
    to stay there forever (300 cancels: 500 records held)."""
    async with rt.open_engine(**NULL) as engine:

        async def one(i: int) -> None:
            async for _ in engine.stream(f"p{i}", max_new_tokens=400, ignore_eos=True):
                break  # the caller goes away: abort and close

        with trio.fail_after(600):
            for wave in range(15):
                async with trio.open_nursery() as nursery:
                    for i in range(200):
                        nursery.start_soon(one, wave * 200 + i)
            detok = await engine.detokenizer_stats(lambda s: s.streams == 0 and s.parked == 0)
            sched = await engine.scheduler_stats(
                lambda s: s.running == 0 and s.waiting == 0 and s.requests == 0
            )
        assert (detok.streams, detok.parked, sched.requests) == (0, 0, 0)
        assert sched.request_tokens == 0 and sched.integrity_ok
        assert not engine.table.records

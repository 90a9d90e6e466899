"""The scheduler actor: admission, duplicates, tombstones, epochs, where a step runs,
and that it keeps nothing per request once every request has ended.

The unit tests drive a ``SchedulerActor`` in this process over a null-model core,
with in-memory stand-ins for its rings; the last one runs the whole pipeline.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import trio

import rt
from rt.actors import ActorContext
from rt.actors.faults import Faults
from rt.gpu import EngineConfig, EngineCore, SamplingParams
from rt.messages import Abort, FinishNow, Scheduled, StepTokens
from rt.pipeline.scheduler import TOMBSTONE_TTL_S, SchedulerActor, StepPlacement
from rt.shm import Frame, codec

TOK = "tok0-sched"


class FakeInbox:
    def __init__(self) -> None:
        self.committed: list[object] = []

    def commit(self, frame: object) -> None:
        self.committed.append(frame)


class FakeOutbox:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, data: bytes) -> None:
        self.sent.append(codec.loads(data))


def null_config(path: Path, **kwargs: Any) -> EngineConfig:
    kwargs.setdefault("max_total_tokens", 4096)
    return EngineConfig(model_path=path, load_format="null", **kwargs)


async def started(
    path: Path, incarnation: int = 1, **config: Any
) -> tuple[SchedulerActor, ActorContext]:
    actor = SchedulerActor(null_config(path, **config), (TOK,))
    ctx = ActorContext(
        "scheduler",
        incarnation,
        Faults(),
        None,
        inbox=cast(Any, {TOK: FakeInbox()}),
        outbox=cast(Any, {"sched-detok": FakeOutbox()}),
    )
    await actor.startup(ctx)
    return actor, ctx


def scheduled(rid: str, n: int = 1, max_new_tokens: int = 50, **kwargs: Any) -> Scheduled:
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True, n=n)
    return Scheduled(rid, np.arange(3, 13), params, **kwargs)


def deliver(actor: SchedulerActor, msg: Scheduled) -> object:
    frame = object()
    actor.incoming.append((msg, TOK, cast(Frame, frame)))
    return frame


def step(actor: SchedulerActor, ctx: ActorContext) -> StepTokens:
    return actor._frame(actor._step(ctx))


async def test_duplicates_are_admitted_once_and_frames_committed(tiny_model: Path) -> None:
    actor, ctx = await started(tiny_model)
    deliver(actor, scheduled("a"))
    last = deliver(actor, scheduled("a"))  # redelivered by a restarted tokenizer
    actor._admit(ctx)
    assert cast(FakeInbox, ctx.inbox[TOK]).committed == [last]
    assert len(actor.engine.reqs["a"]) == 1 and not actor.refused
    step(actor, ctx)
    deliver(actor, scheduled("a"))  # a resubmission while it runs
    actor._admit(ctx)
    assert actor.engine.num_waiting == 0 and not actor.refused


async def test_abort_before_its_request_arrives_leaves_a_tombstone(tiny_model: Path) -> None:
    actor, ctx = await started(tiny_model)
    actor._stop(Abort("early"))  # overtook its Scheduled, still on the tokenizer's ring
    deliver(actor, scheduled("queued"))
    actor._stop(FinishNow("queued"))  # its Scheduled waits for admission
    assert actor.num_request_records == 3  # two tombstones and one queued frame
    deliver(actor, scheduled("early"))
    actor._admit(ctx)
    assert not actor.engine.has_work and not actor.refused
    assert actor.num_request_records == 0  # each tombstone went with its Scheduled


async def test_tombstones_expire_and_the_idle_report_says_so(
    tiny_model: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """An abort for a request that already ended here leaves a tombstone that no
    Scheduled will clear: it goes after the TTL, and the idle report follows."""
    actor, ctx = await started(tiny_model)
    actor._stop(Abort("gone"))
    out = cast(FakeOutbox, ctx.outbox["sched-detok"])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor._idle, ctx)
        await trio.sleep(1)
        assert [f.stats.requests for f in out.sent] == [1]
        await trio.sleep(TOMBSTONE_TTL_S + 2)
        assert [f.stats.requests for f in out.sent] == [1, 0]
        actor.wakeup.set()
    assert not actor.tombstones


async def test_aborts_leave_nothing_behind(tiny_model: Path) -> None:
    actor, ctx = await started(tiny_model)
    for rid in ("a", "b"):
        deliver(actor, scheduled(rid, n=3))
    actor._admit(ctx)
    step(actor, ctx)
    actor._stop(Abort("a"))  # held by the core: no tombstone
    actor._stop(FinishNow("b"))
    assert not actor.tombstones
    ended = {(s.rid, s.index): s.finish_reason for s in step(actor, ctx).seqs}
    assert ended == {(r, i): f for r, f in (("a", "abort"), ("b", "finish")) for i in range(3)}
    assert actor.num_request_records == 0 and not actor.engine.reqs


async def test_frames_carry_the_epoch_and_resumed_offsets(tiny_model: Path) -> None:
    actor, ctx = await started(tiny_model, incarnation=3)
    prior = (np.array([7, 8, 9]), np.array([], np.int64), np.array([5]))
    deliver(actor, scheduled("r", n=3, output_ids=prior, finished=(1,)))
    actor._admit(ctx)
    first: dict[int, int] = {}  # child -> offset of its first reported token
    for _ in range(3):  # child 2 waits for child 0 to cache the prompt
        frame = step(actor, ctx)
        assert frame.epoch == 3
        for s in frame.seqs:
            first.setdefault(s.index, s.token_offset)
    assert first == {0: 3, 2: 1}


async def test_a_request_the_core_cannot_take_is_refused_alone(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    actor, ctx = await started(tiny_model)
    deliver(actor, Scheduled("bad-ids", cast(Any, "not an array"), SamplingParams()))
    deliver(actor, scheduled("too-long", output_ids=(np.arange(3, 60),)))
    actor._admit(ctx)
    refused = {r.rid: (r.error, r.message) for r in step(actor, ctx).refused}
    assert refused["bad-ids"][0] == "InvalidRequestError"
    assert refused["too-long"] == (
        "InvalidRequestError",
        "output_ids[0]: expected fewer than max_new_tokens=50 prior tokens for a child that "
        "is not finished, got 57; list the child in finished",
    )

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(actor.engine, "add_request", broken)
    deliver(actor, scheduled("unlucky"))
    actor._admit(ctx)
    (refusal,) = step(actor, ctx).refused
    assert refusal.error == "RequestFailedError" and "RuntimeError: boom" in refusal.message
    assert actor.num_request_records == 0


def test_a_step_that_may_prefill_never_runs_inline(tiny_model: Path) -> None:
    engine = EngineCore(null_config(tiny_model, chunked_prefill_size=16))
    placement = StepPlacement(inline_s=0.001)
    engine.add_request("a", list(range(3, 13)), SamplingParams(max_new_tokens=100))
    assert not placement.inline(engine)  # a prefill
    placement.record(engine.step(), 0.0001)  # an extend: not a decode measurement
    assert not placement.inline(engine)  # the first decode is not measured yet
    for _ in range(3):
        placement.record(engine.step(), 0.0001)
        assert placement.inline(engine)  # fast decodes run inline
    # a long prompt after fast decodes: every step of its chunked prefill goes to the thread
    engine.add_request("long", list(range(100, 157)), SamplingParams(max_new_tokens=100))
    chunks = 0
    while placement.inline(engine) is False and engine.next_step_prefills:
        out = engine.step()
        placement.record(out, 0.0001)
        chunks += out.forward_mode == "extend"
    assert chunks == 4  # 57 tokens in chunks of 16
    assert placement.inline(engine)
    for _ in range(10):  # decodes grew slow: off the trio thread again
        placement.record(engine.step(), 0.01)
    assert not placement.inline(engine)


async def test_a_step_with_nothing_to_report_wakes_no_detokenizer(tiny_model: Path) -> None:
    """Under overlap scheduling a prefill's token is read at the next step: the
    prefill alone has nothing to say, and a frame would only wake the
    detokenizer while that next step should run (on a first token's path)."""
    actor, ctx = await started(tiny_model, overlap_schedule=True)
    out = cast(FakeOutbox, ctx.outbox["sched-detok"])
    deliver(actor, scheduled("a", max_new_tokens=4))
    actor.report_due = math.inf  # no stats report rides on a step here
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor._loop, ctx)
        while not any(s.finish_reason for f in out.sent for s in f.seqs):
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    steps = [f for f in out.sent if f.stats is None]
    # one token a frame, from the first: no frame went out empty
    assert [[(s.token_offset, len(s.ids)) for s in f.seqs] for f in steps] == [
        [(i, 1)] for i in range(4)
    ]
    assert actor.steps == 5  # the prefill is still counted as a step


@pytest.mark.slow
async def test_a_thousand_cancelled_streams_leave_no_request_record(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Each request is left at its first chunk. None may have ended by then: the
    abort of a request that already ended here leaves a tombstone by design (the
    module's docstring). With 400 steps of at least 5 ms each to go, one would
    need its reader starved for 2 s (on a loaded machine, with no delay, some
    ended before their reader left after two chunks)."""
    plan = tmp_path / "slow.json"
    delay = {"actor": "scheduler", "point": "step", "action": "delay", "delay_ms": 5, "times": 0}
    plan.write_text(json.dumps({"seed": 1, "faults": [delay]}))
    options: dict[str, Any] = dict(load_format="null", max_total_tokens=8192, ring_capacity=1 << 20)
    cancelled = 0
    async with rt.open_engine(str(tiny_model), fault_plan=str(plan), **options) as engine:

        async def one(i: int) -> None:
            nonlocal cancelled
            async for _ in engine.stream(
                f"request {i}", max_new_tokens=400, ignore_eos=True, temperature=0.0
            ):
                cancelled += 1
                break  # leaving the stream aborts the request

        with trio.fail_after(60):
            await engine.generate("warm up", max_new_tokens=2)
            # the report after the warm-up (the one before it, at start-up, says steps=0)
            before = await engine.scheduler_stats(lambda s: s.steps > 0 and s.running == 0)
            async with trio.open_nursery() as nursery:
                for i in range(1000):
                    nursery.start_soon(one, i)
        # well under the tombstone TTL: a tombstone left behind fails here, not expires
        with trio.fail_after(TOMBSTONE_TTL_S / 3):
            # A report newer than `before` comes after the burst: the scheduler reports
            # only once idle, and until every request is aborted it holds some, running
            # (400 tokens each, far more than 2 chunks) or waiting their turn in the core.
            stats = await engine.scheduler_stats(
                lambda s: (
                    s.steps > before.steps and s.running == 0 and s.waiting == 0 and s.requests == 0
                )
            )
    assert cancelled == 1000
    assert stats.integrity_ok and stats.request_tokens == 0, stats

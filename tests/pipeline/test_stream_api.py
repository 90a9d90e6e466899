"""A stream used from more than one task, or closed while it is read; and what
the body of ``open_engine`` raises."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
import trio

import rt
import rt.actors
from rt.errors import InvalidRequestError

OPTIONS: dict[str, Any] = dict(max_total_tokens=8192)
LONG = dict(max_new_tokens=400, ignore_eos=True, temperature=0.0)


async def reusable(engine: rt.Engine, rid: str) -> None:
    """The rid is free again (it was "already in flight" for good before), and
    nothing is left in the table or the scheduler."""
    with trio.fail_after(30):
        out = await engine.generate("again", rid=rid, max_new_tokens=2, ignore_eos=True)
    assert len(out.output_ids) == 2
    assert not engine.table.records
    stats = await engine.scheduler_stats(lambda s: s.running == 0 and s.waiting == 0)
    assert stats.request_tokens == 0, stats


async def test_a_stream_closed_by_another_task_ends_its_reader(tiny_model) -> None:
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        # closed while its reader is still submitting it: the request is aborted
        stream, got = engine.stream("hello", rid="A", **LONG), []

        async def read(s: rt.Stream) -> None:
            async for chunk in s:
                got.append(chunk)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read, stream)
                await trio.lowlevel.checkpoint()  # the reader is inside the submission
                stream.close()
        assert len(got) <= 1  # it once read on, or stopped silently with the rest running
        await reusable(engine, "A")

        # closed while its reader waits for the next chunk: the reader ends (it hung)
        await engine.pause_generation()
        stream, got = engine.stream("hello", rid="B", **LONG), []
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read, stream)
                while not any(r.input_ids is not None for r in engine.table.live()):
                    await trio.sleep(0.01)  # tokenized: the reader waits for a first token
                await stream.aclose()
        assert got == []
        await engine.continue_generation()
        await reusable(engine, "B")


async def test_one_reader_at_a_time(tiny_model) -> None:
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        stream, counts, errors = engine.stream("hello", rid="C", max_new_tokens=30), [], []

        async def read() -> None:
            try:
                counts.append(sum([1 async for _ in stream]))
            except trio.BusyResourceError as err:
                errors.append(str(err))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                nursery.start_soon(read)
        assert errors == ["another task is already reading this stream"]
        assert len(counts) == 1 and counts[0] >= 1
        await reusable(engine, "C")


async def test_what_the_body_raises_comes_out_as_itself(tiny_model) -> None:
    """Not wrapped in the nurseries' groups: ``except KeyError`` around the
    ``async with`` catches it (it took ``except* KeyError``)."""
    with pytest.raises(InvalidRequestError, match="temperature"):
        async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
            await engine.generate("x", temperature=-1.0)
    mine = KeyError("mine")
    with pytest.raises(KeyError) as caught:
        async with rt.open_engine(str(tiny_model), **OPTIONS):
            raise mine
    assert caught.value is mine and mine.__context__ is None
    group = ExceptionGroup("mine", [KeyError("a"), ValueError("b")])  # a nursery's, say
    with pytest.raises(ExceptionGroup) as grouped:
        async with rt.open_engine(str(tiny_model), **OPTIONS):
            raise group
    assert grouped.value is group  # it came out wrapped twice more: EG(EG(group's copy))


async def test_a_stream_collected_in_another_thread_is_aborted_in_the_engines(
    tiny_model,
) -> None:
    """The garbage collector frees an abandoned stream wherever it runs: in a
    worker thread that once left the engine's control sender asleep for good
    (every later request hung, and the ``async with`` never exited)."""
    import gc

    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        stream = engine.stream("hello", rid="F", **LONG)
        await stream.__anext__()
        cycle: list[Any] = [stream]
        cycle.append(cycle)
        del stream, cycle
        gc.disable()
        try:
            await trio.to_thread.run_sync(gc.collect)
        finally:
            gc.enable()
        await reusable(engine, "F")


async def test_a_stream_read_to_its_last_chunk_frees_its_rid(tiny_model) -> None:
    """``if chunk.finish_reason: break`` leaves the stream open (``async for``
    does not close it): its rid was refused as in flight until it was closed."""
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        stream = engine.stream("hello", rid="D", n=2, max_new_tokens=6, ignore_eos=True)
        ids: dict[int, list[int]] = {0: [], 1: []}
        with trio.fail_after(30):
            async for chunk in stream:
                ids[chunk.index] += chunk.output_ids
                if all(len(got) == 6 for got in ids.values()):
                    assert chunk.finish_reason == "length"
                    break  # the last chunk; the stream stays open
        await reusable(engine, "D")
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        await stream.aclose()


async def test_a_stream_as_a_context_manager_aborts_at_its_exit(tiny_model) -> None:
    """``break`` out of a stream kept in a variable leaves it open (Python's
    ``async for`` says nothing to the iterator): ``async with`` closes it."""
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        async with engine.stream("hello", rid="C", **LONG) as stream:
            async for _ in stream:
                break
        await reusable(engine, "C")  # aborted at once: 400 tokens would take seconds


async def in_another_run(use: Any) -> str:
    """What awaiting ``use()`` in a thread's own ``trio.run`` says: the RuntimeError's
    message, or "used"."""

    def other_run() -> str:
        async def call() -> str:
            try:
                await use()
            except RuntimeError as err:
                return str(err)
            return "used"

        return trio.run(call)

    with trio.fail_after(30):
        return await trio.to_thread.run_sync(other_run)


async def test_a_caller_in_another_trio_run_is_refused_and_the_engine_goes_on(
    tiny_model,
) -> None:
    """A thread's own ``trio.run`` calling the engine killed the engine's run (an
    AssertionError inside trio, when the engine woke the foreign task); so did
    reading a stream made in the engine's run, and closing it hung the engine's
    controls for good (a review of the trio API)."""
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        said = await in_another_run(lambda: engine.generate("hi", max_new_tokens=2))
        assert "this engine lives in another trio run" in said, said
        async with engine.stream("hi", **LONG) as stream:
            await stream.__anext__()
            for use in (stream.__anext__, stream.aclose):
                said = await in_another_run(use)
                assert "this engine lives in another trio run" in said, said
        with trio.fail_after(30):
            out = await engine.generate("hi", max_new_tokens=2, ignore_eos=True)
            await engine.pause_generation()
            await engine.continue_generation()
        assert len(out.output_ids) == 2
        assert all(a.restart_count == 0 for a in engine.actors())


async def test_controls_after_the_engine_closed_raise(tiny_model) -> None:
    """They waited for a scheduler's answer that could never come, and so did a
    wait for the scheduler's stats still pending when the engine closed."""
    waiting: list[BaseException] = []

    async def wait_for_stats(engine: rt.Engine) -> None:
        try:
            await engine.scheduler_stats(lambda s: False)
        except rt.errors.EngineShutdownError as err:
            waiting.append(err)

    with trio.fail_after(60):
        async with (
            trio.open_nursery() as outer,
            rt.open_engine(str(tiny_model), **OPTIONS) as engine,
        ):
            outer.start_soon(wait_for_stats, engine)
            await trio.sleep(0.1)
    assert len(waiting) == 1
    with trio.fail_after(10):
        for control in (engine.flush_cache, engine.pause_generation, engine.continue_generation):
            with pytest.raises(rt.errors.EngineShutdownError):
                await control()
        for stats in (engine.scheduler_stats, engine.detokenizer_stats):  # stale: not given
            with pytest.raises(rt.errors.EngineShutdownError):
                await stats()


async def test_abort_by_rid_ends_that_request_alone(tiny_model) -> None:
    """``engine.abort(rid)``: another task's request ends with RequestAborted, after
    what it had read; its KV is freed and its rid free; the others go on."""
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        aborted: list[BaseException] = []

        async def victim(rid: str, chunks: list[rt.Chunk]) -> None:
            try:
                if rid == "by-generate":
                    await engine.generate("hello", rid=rid, **LONG)
                async for chunk in engine.stream("hello", rid=rid, **LONG):
                    chunks.append(chunk)
            except rt.errors.RequestAborted as err:
                aborted.append(err)

        with trio.fail_after(60):
            other = engine.stream("bystander", max_new_tokens=24, ignore_eos=True)
            async with trio.open_nursery() as nursery:
                read: list[rt.Chunk] = []
                nursery.start_soon(victim, "by-stream", read)
                while not read:
                    await trio.sleep(0.01)
                assert engine.abort("by-stream")
                nursery.start_soon(victim, "by-generate", [])
                while "by-generate" not in engine.table.by_user_rid:
                    await trio.sleep(0)
                assert engine.abort("by-generate")  # (before its prompt is tokenized, even)
                assert not engine.abort("by-generate")  # once
                out = [c async for c in other]
        assert [str(e) for e in aborted] == [
            "rid 'by-stream': aborted by abort()",
            "rid 'by-generate': aborted by abort()",
        ]
        assert 0 < sum(len(c.output_ids) for c in read) < 400
        assert sum(len(c.output_ids) for c in out) == 24
        assert not engine.abort("never-was")
        assert not engine.abort(out[-1].rid)  # finished
        with pytest.raises(InvalidRequestError, match="rid: expected a string, got list"):
            engine.abort(["by-stream"])  # type: ignore[arg-type]  # (it raised TypeError)
        await reusable(engine, "by-stream")
        await reusable(engine, "by-generate")


async def test_abort_reaches_a_request_waiting_for_an_actor_to_come_back(tmp_path) -> None:
    """A request waiting to be sent (its tokenizer restarting) is not in the table
    yet: abort() returned False, and it was sent once the actor was back."""
    plan = tmp_path / "plan.json"  # the second tokenizer hangs in its start-up
    rule = {"actor": "tokenizer0", "point": "startup", "action": "hang", "incarnation": 2}
    plan.write_text(json.dumps({"seed": 1, "faults": [rule]}))
    null = dict(device="cpu", load_format="null", torch_threads=1, restart_wait_timeout=120.0)
    async with rt.open_engine(fault_plan=str(plan), **null) as engine:
        pid = next(a.pid for a in engine.actors() if a.name == "tokenizer0")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await engine.supervisor.wait_for(
            lambda s: s.actor("tokenizer0").state is not rt.actors.ActorState.RUNNING
        )
        raised: list[BaseException] = []

        async def waiter() -> None:
            try:
                await engine.generate("hi", rid="waiting", max_new_tokens=2)
            except rt.errors.RequestAborted as err:
                raised.append(err)

        with trio.fail_after(30):  # (not the 120 s of restart_wait_timeout)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.sleep(0.5)  # built and waiting for the tokenizer (ms)
                assert not raised and not engine.table.records
                assert engine.abort("waiting")
        assert [str(e) for e in raised] == ["rid 'waiting': aborted by abort()"]
        assert not engine.abort("waiting") and not engine.table.records

"""The operator's controls (flush the prefix cache, pause and continue
generation) and what a stream reports beyond its text: logprobs per chunk,
and the request's counts and queue time."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import trio

import rt
from rt.actors import ActorState

OPTIONS: dict[str, Any] = dict(max_total_tokens=8192, ring_capacity=1 << 20)
PROMPT = "The quick brown fox jumps over the lazy dog. " * 4
GREEDY: dict[str, Any] = dict(max_new_tokens=40, ignore_eos=True, temperature=0.0)
# A request the pause must catch running: 40 tokens of the tiny model can all come
# (~1–2 ms a step) before a pause polled for and sent after the first ones lands.
LONG: dict[str, Any] = dict(GREEDY, max_new_tokens=200)  # (~0.2–0.4 s of steps)


async def first_chunks(stream: rt.Stream, count: int) -> list[rt.Chunk]:
    return [await stream.__anext__() for _ in range(count)]


class Reader:
    """Reads a stream in a task of its own (a timeout around the iteration would
    cancel it, and a cancelled stream aborts its request)."""

    def __init__(self, stream: rt.Stream) -> None:
        self.stream = stream
        self.ids: list[int] = []
        self.done = trio.Event()
        self.scope = trio.CancelScope()  # cancelling it aborts the request

    async def run(self) -> None:
        with self.scope:
            async for chunk in self.stream:
                self.ids += chunk.output_ids
            self.done.set()

    async def still(self, seconds: float) -> bool:
        """Whether no token came for ``seconds`` (after letting one in flight land)."""
        await trio.sleep(0.3)
        before = len(self.ids)
        await trio.sleep(seconds)
        return len(self.ids) == before and not self.done.is_set()


async def restarted(engine: rt.Engine, before: int) -> None:
    """Wait until a scheduler past incarnation ``before`` runs."""
    with trio.fail_after(60):
        await engine.supervisor.wait_for(
            lambda s: (
                s.actor("scheduler").incarnation > before
                and s.actor("scheduler").state is ActorState.RUNNING
            )
        )


async def test_flush_cache_drops_cached_prefixes_only_when_idle(tiny_model) -> None:
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        await engine.generate(PROMPT, **GREEDY)
        cached = await engine.scheduler_stats(lambda s: s.running == 0 and s.cached_tokens > 0)
        again = await engine.generate(PROMPT, **GREEDY)
        assert again.meta.cached_tokens > 0  # the prefix cache served it

        stream = engine.stream(PROMPT + " more", max_new_tokens=400, ignore_eos=True)
        await first_chunks(stream, 1)
        assert await engine.flush_cache() is False  # a request is running: nothing done
        stats = await engine.scheduler_stats()
        assert stats.cached_tokens > 0 and not stats.control_ok
        await stream.aclose()
        await engine.scheduler_stats(lambda s: s.requests == 0)

        assert await engine.flush_cache() is True
        stats = await engine.scheduler_stats()
        assert stats.cached_tokens == 0
        assert stats.free_tokens > cached.free_tokens  # the slots went back to the pool
        fresh = await engine.generate(PROMPT, **GREEDY)
        assert fresh.meta.cached_tokens == 0
        assert fresh.output_ids == again.output_ids


async def test_pause_holds_every_request_and_continue_finishes_them_unchanged(tiny_model) -> None:
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine, trio.open_nursery() as n:
        await engine.generate(PROMPT, **LONG)  # fills the prefix cache, then: as the others
        want = await engine.generate(PROMPT, **LONG)  # (their last prompt token, one row)
        running = Reader(engine.stream(PROMPT, **LONG))
        n.start_soon(running.run)
        with trio.fail_after(30):
            while len(running.ids) < 2:
                await trio.sleep(0.01)

        await engine.pause_generation()
        assert engine.paused
        assert await running.still(1.0)
        stats = await engine.scheduler_stats()
        assert stats.paused and stats.running == 1
        # the prompt it reads from the prefix cache is KV it holds, not the cache's to free
        assert stats.request_tokens > want.meta.prompt_tokens, stats
        assert stats.request_tokens + stats.cached_tokens + stats.free_tokens == 8192

        # a new request is accepted and waits too; a cancelled one frees its KV at once
        newcomer = Reader(engine.stream(PROMPT, **GREEDY))
        n.start_soon(newcomer.run)
        assert await newcomer.still(0.5) and newcomer.ids == []
        newcomer.scope.cancel()
        with trio.fail_after(10):
            await engine.scheduler_stats(lambda s: s.paused and s.requests == 1)

        await engine.continue_generation()
        assert not engine.paused
        with trio.fail_after(30):
            await running.done.wait()
        assert running.ids == list(want.output_ids)
        assert (await engine.generate(PROMPT, **LONG)).output_ids == want.output_ids
        await engine.continue_generation()  # a no-op when not paused


async def test_a_restarted_scheduler_stays_paused_and_its_deaths_are_not_the_requests(
    tiny_model,
) -> None:
    """Kills while paused run none of a request's work: as many as would mark a
    lone request as poison (``max_crashes_per_request``) are charged to none."""
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine, trio.open_nursery() as n:
        want = await engine.generate(PROMPT, **LONG)
        reader = Reader(engine.stream(PROMPT, **LONG))
        n.start_soon(reader.run)
        with trio.fail_after(30):
            while not reader.ids:
                await trio.sleep(0.01)
        await engine.pause_generation()

        for _ in range(engine.options.max_crashes_per_request):
            (scheduler,) = [a for a in engine.actors() if a.name == "scheduler"]
            os.kill(scheduler.pid or 0, signal.SIGKILL)
            await restarted(engine, scheduler.incarnation)
            with trio.fail_after(60):
                await engine.scheduler_stats(lambda s: s.paused and s.requests == 1)
        assert await reader.still(1.0)
        assert engine.supervisor.status().actor("scheduler").request_crashes == 0

        await engine.continue_generation()
        with trio.fail_after(30):
            await reader.done.wait()
        assert reader.ids == list(want.output_ids)


async def test_chunks_carry_their_logprobs_and_the_stream_its_meta(tiny_model) -> None:
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        options = dict(GREEDY, logprobs=True, top_logprobs=3, n=2, temperature=0.8, seed=5)
        whole = await engine.generate(PROMPT, **options)
        # the first prompt a new engine sees: none of it was cached, though the second
        # sample read what the first computed
        assert whole.meta.cached_tokens == 0
        stream = engine.stream(PROMPT, **options)
        logprobs: dict[int, list[float]] = {0: [], 1: []}
        top: dict[int, list[Any]] = {0: [], 1: []}
        async for chunk in stream:
            assert chunk.logprobs is not None and chunk.top_logprobs is not None
            assert len(chunk.logprobs) == len(chunk.output_ids) == len(chunk.top_logprobs)
            logprobs[chunk.index] += chunk.logprobs
            top[chunk.index] += chunk.top_logprobs
        for i, choice in enumerate(whole.choices):
            # the same numbers, but for float noise: the second run's prompt came from the cache
            assert logprobs[i] == pytest.approx(list(choice.logprobs or ()), abs=1e-4)
            assert [[t for t, _ in alt] for alt in top[i]] == [
                [t for t, _ in alt] for alt in choice.top_logprobs or ()
            ]
            assert all(len(alt) == 3 for alt in top[i])
            assert [alt[0][1] for alt in top[i]] == pytest.approx(
                [max(lp, alt[0][1]) for lp, alt in zip(logprobs[i], top[i], strict=True)]
            )  # the best alternative is at least as likely as the token drawn

        meta = stream.meta
        assert meta is not None
        assert meta.prompt_tokens == whole.meta.prompt_tokens > 0
        assert meta.completion_tokens == 2 * GREEDY["max_new_tokens"]
        assert meta.queue_time is not None and meta.latency is not None
        assert meta.time_to_first_token is not None
        assert 0 <= meta.queue_time <= meta.time_to_first_token <= meta.latency
        assert whole.meta.queue_time is not None

        plain = [c async for c in engine.stream(PROMPT, max_new_tokens=4)]
        assert all(c.logprobs is None and c.top_logprobs is None for c in plain)


async def test_prompt_logprobs_come_once_with_the_prompt_ids(tiny_model) -> None:
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        options = dict(max_new_tokens=3, prompt_logprobs=True, top_logprobs=2)
        whole = await engine.generate(PROMPT, **options)
        assert whole.prompt_ids is not None and whole.prompt_logprobs is not None
        assert len(whole.prompt_ids) == whole.meta.prompt_tokens
        assert len(whole.prompt_logprobs) == len(whole.prompt_ids) - 1
        assert whole.prompt_top_logprobs is not None
        assert all(len(alts) == 2 for alts in whole.prompt_top_logprobs)
        chunks = [c async for c in engine.stream(PROMPT, **options)]
        carrying = [c for c in chunks if c.prompt_logprobs is not None]
        assert len(carrying) == 1 and carrying[0] is chunks[0]
        assert carrying[0].prompt_ids == whole.prompt_ids
        assert carrying[0].prompt_logprobs == pytest.approx(whole.prompt_logprobs, abs=1e-4)
        plain = await engine.generate(PROMPT, max_new_tokens=3)
        assert plain.prompt_ids is None and plain.prompt_logprobs is None


async def test_a_reader_that_falls_behind_gets_fewer_bigger_chunks(tiny_model) -> None:
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        want = await engine.generate(PROMPT, **GREEDY)
        before = await engine.scheduler_stats()
        stream = engine.stream(PROMPT, **GREEDY, logprobs=True)
        first = await stream.__anext__()
        with trio.fail_after(30):  # let the rest pile up behind the reader
            await engine.scheduler_stats(lambda s: s.steps > before.steps and s.requests == 0)
        rest = [c async for c in stream]
        chunks = [first, *rest]
        remaining = GREEDY["max_new_tokens"] - len(first.output_ids)
        # (under load, the first read may find them all made already: one chunk)
        assert len(rest) < remaining or len(rest) == remaining == 0
        assert [t for c in chunks for t in c.output_ids] == list(want.output_ids)
        assert "".join(c.text for c in chunks) == want.text
        assert all(len(c.logprobs or ()) == len(c.output_ids) for c in chunks)
        assert chunks[-1].finish_reason == "length" and all(c.stepped_at > 0 for c in chunks)


async def test_a_request_that_comes_while_paused_is_reported(tiny_model) -> None:
    """The scheduler reported nothing while paused but for its commands: a
    request admitted after the pause was not in any report until generation
    went on (/server_info showed none waiting)."""
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine, trio.open_nursery() as n:
        await engine.pause_generation()
        reader = Reader(engine.stream(PROMPT, **GREEDY))
        n.start_soon(reader.run)
        with trio.fail_after(20):
            await engine.scheduler_stats(lambda s: s.paused and s.requests == 1)
        assert await reader.still(0.5) and reader.ids == []
        await engine.continue_generation()
        with trio.fail_after(30):
            await reader.done.wait()
        assert len(reader.ids) == GREEDY["max_new_tokens"]


async def test_of_a_pause_and_a_continue_both_resent_to_a_new_scheduler_the_later_wins(
    tiny_model,
) -> None:
    """Both calls wait on a stopped scheduler, which is then killed: each used to
    send its own op again to the successor, in the order trio woke them (at
    random), so the pause could land last: paused for good, /health 200."""
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        for _ in range(3):  # (each trial's wake order is a coin flip)
            (scheduler,) = [a for a in engine.actors() if a.name == "scheduler"]
            os.kill(scheduler.pid or 0, signal.SIGSTOP)
            async with trio.open_nursery() as n:
                n.start_soon(engine.pause_generation)
                await trio.sleep(0.05)
                n.start_soon(engine.continue_generation)
                await trio.sleep(0.05)
                os.kill(scheduler.pid or 0, signal.SIGKILL)
            assert not engine.paused
            with trio.fail_after(30):
                out = await engine.generate(PROMPT, **GREEDY)
            assert len(out.output_ids) == GREEDY["max_new_tokens"]
            assert not (await engine.scheduler_stats()).paused


async def test_a_flush_right_after_a_stop_string_finds_the_request_gone(tiny_model) -> None:
    """The frontend's FinishNow for a stop string comes before the flush; the
    flush was judged before the finish was applied: 400 "requests running"."""
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        text = (await engine.generate(PROMPT, **LONG)).text
        stop = text[20:23]
        for _ in range(5):
            out = await engine.generate(PROMPT, **LONG, stop=[stop])
            assert out.finish_reason == "stop"
            assert await engine.flush_cache() is True


async def test_a_scheduler_restarted_while_paused_runs_no_step_before_it_is_told(
    tiny_model,
) -> None:
    """A successor started unpaused and ran the requests waiting in its rings for a
    few steps before the frontend's pause reached it: tokens streamed while paused."""
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine, trio.open_nursery() as n:
        want = await engine.generate(PROMPT, **GREEDY)
        await engine.pause_generation()
        readers = []
        for _ in range(3):  # (the race is the successor's start against the pause)
            (scheduler,) = [a for a in engine.actors() if a.name == "scheduler"]
            os.kill(scheduler.pid or 0, signal.SIGSTOP)
            for _ in range(4):  # they wait in the stopped scheduler's rings
                readers.append(Reader(engine.stream(PROMPT, **GREEDY)))
                n.start_soon(readers[-1].run)
            await trio.sleep(0.3)
            os.kill(scheduler.pid or 0, signal.SIGKILL)
            await restarted(engine, scheduler.incarnation)
            await trio.sleep(1.0)
            assert [r.ids for r in readers] == [[]] * len(readers)
        await engine.continue_generation()
        with trio.fail_after(30):
            for reader in readers:
                await reader.done.wait()
        assert all(r.ids == list(want.output_ids) for r in readers)

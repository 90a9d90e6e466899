"""The engine's life seen from the Python API: options refused before anything
starts, open_engine outside trio, and the end of its block with requests in
flight or still waiting (nothing left behind, every caller told)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
import trio

import rt
import rt.actors
from rt.errors import Closed, EngineShutdownError

OPTIONS: dict[str, Any] = dict(device="cpu", max_total_tokens=8192, ring_capacity=1 << 20)
PROMPTS = ["The quick brown fox", "Once upon a time", "日本語の文章", "lazy dog. The"]


async def test_shutdown_with_requests_in_flight_is_clean(tiny_model) -> None:
    """Leaving ``open_engine`` with 16 streams in flight: each caller is cancelled
    (no hang, no stray error), every actor process is gone and every segment
    unlinked (the suite's leak fixture checks fds and orphans as well)."""
    started, cancelled = trio.Event(), []
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        pids = [a.pid for a in engine.actors()]
        prefix = engine.supervisor.prefix
        async with trio.open_nursery() as nursery:

            async def one(i: int) -> None:
                try:
                    async for _ in engine.stream(
                        PROMPTS[i % len(PROMPTS)], max_new_tokens=400, ignore_eos=True
                    ):
                        started.set()
                except trio.Cancelled:
                    cancelled.append(i)
                    raise

            for i in range(16):
                nursery.start_soon(one, i)
            with trio.fail_after(60):
                await started.wait()
            nursery.cancel_scope.cancel()
    assert sorted(cancelled) == list(range(16))
    assert all(
        state is rt.actors.ActorState.STOPPED for state in (a.state for a in engine.actors())
    )
    assert None not in pids and not [pid for pid in pids if _running(pid)]
    assert not [s for s in os.listdir("/dev/shm") if s.startswith(prefix)]


async def test_callers_that_outlive_the_engine_are_told_it_shut_down_at_once(
    tiny_model,
) -> None:
    """Requests of tasks outside ``open_engine``'s block, still waiting when it ends:
    for room in a full tokenizer ring (they raised the ring's own ``Closed``, not
    ``EngineShutdownError``), or for a killed actor to come back (they waited out
    ``restart_wait_timeout``, 60 s, and then blamed the actors)."""
    got: list[BaseException | None] = []

    async def one(engine: rt.Engine, prompt: str) -> None:
        try:
            await engine.generate(prompt, max_new_tokens=2, allow_auto_truncate=True)
            got.append(None)
        except (EngineShutdownError, Closed) as err:
            got.append(err)

    options = {**OPTIONS, "ring_capacity": 1 << 16, "restart_wait_timeout": 60}
    with trio.fail_after(30):
        async with trio.open_nursery() as outer:
            async with rt.open_engine(str(tiny_model), **options) as engine:
                for _ in range(300):  # 2.4 MB for a ring of 64 KiB
                    outer.start_soon(one, engine, "And it came to pass " * 400)
                await trio.sleep(0.2)
                unanswered = 300 - len(got)
            async with rt.open_engine(str(tiny_model), **options) as engine:
                os.kill(next(a.pid for a in engine.actors() if a.name == "scheduler"), 9)
                await engine.supervisor.wait_for(lambda s: not s.healthy)
                for _ in range(3):
                    outer.start_soon(one, engine, "In the beginning")
                await trio.sleep(0.2)
                assert len(engine.rids) == 3  # waiting for the scheduler
                closed_at = trio.current_time()
        assert trio.current_time() - closed_at < 10
    failed = [err for err in got if err is not None]
    assert unanswered > 0 and len(got) == 303 and len(failed) > 3  # (some of the 300 too)
    assert {type(err) for err in failed} == {EngineShutdownError}


def _running(pid: int | None) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_bad_options_are_refused_before_anything_starts(tiny_model) -> None:
    with pytest.raises(rt.errors.ConfigError, match="page_size"):
        async with rt.open_engine(str(tiny_model), page_size=0):
            pass
    with pytest.raises(rt.errors.ConfigError, match="no_such_option"):
        async with rt.open_engine(str(tiny_model), no_such_option=1):
            pass
    for chunk, says in ((0, "-1 turns chunking off"), (-2, "greater than or equal to -1")):
        with pytest.raises(rt.errors.ConfigError, match=f"chunked_prefill_size: .*{says}"):
            async with rt.open_engine(str(tiny_model), chunked_prefill_size=chunk):
                pass
    with pytest.raises(rt.errors.ConfigError, match=r"scheduler_cpus: .*numbers and ranges"):
        async with rt.open_engine(str(tiny_model), scheduler_cpus="first"):
            pass
    # each of these was a crash loop (torch's overflow) or a raw error of Python's
    refused: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
        ((str(tiny_model),), {"torch_threads": 2**70}, "torch_threads: .*less than or equal"),
        ((str(tiny_model),), {"max_total_tokens": 2**70}, "max_total_tokens: .*less than or"),
        ((str(tiny_model),), {"max_running_requests": 2**70}, "max_running_requests: .*less"),
        ((str(tiny_model),), {"fault_plan": 5}, "fault_plan: .*expected a FaultPlan or a path"),
        ((str(tiny_model / "config.json"),), {}, "model_path: .*config.json is not a directory"),
    ]
    for args, options, says in refused:
        with pytest.raises(rt.errors.ConfigError, match=says):
            async with rt.open_engine(*args, **options):
                pass


def test_open_engine_outside_a_trio_run_says_it_needs_one() -> None:
    """Under asyncio (where a user of vLLM's AsyncLLMEngine tries it first) it was
    trio's own AttributeError, from deep in a nursery."""

    async def under_asyncio() -> None:
        async with rt.open_engine():
            pass

    with pytest.raises(RuntimeError, match=r"rt\.open_engine runs in a trio run"):
        asyncio.run(under_asyncio())

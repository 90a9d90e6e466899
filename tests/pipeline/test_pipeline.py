"""The whole pipeline: real processes, real rings, a real (tiny) model."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

import rt
import rt.actors
from rt.errors import InvalidRequestError
from rt.frontend.tokenizer_queues import DOWN_CHECK_S
from rt.gpu import EngineConfig, EngineCore, SamplingParams
from rt.messages import GenerateRequest
from rt.tok.load import load_tokenizer

# on the CPU wherever torch sees a GPU too: outputs are compared with the engine core's
OPTIONS: dict[str, Any] = dict(device="cpu", max_total_tokens=8192, ring_capacity=1 << 20)
PROMPTS = [
    "The quick brown fox",
    "Once upon a time",
    "日本語の文章",
    "Emoji: 😀🎉",
    "Combining: e\u0301 café",
    "lazy dog. The",
    "tiny model that",
    "served requests.",
]


def core_outputs(model: Path, reqs: list[tuple[str, dict[str, Any]]]) -> list[list[int]]:
    """The engine core alone, in this process, on the same requests."""
    tokenizer = load_tokenizer(str(model))
    core = EngineCore(EngineConfig(model_path=model, max_total_tokens=8192))
    for i, (text, params) in enumerate(reqs):
        core.add_request(str(i), tokenizer(text)["input_ids"], SamplingParams(**params))
    out: dict[str, list[int]] = {str(i): [] for i in range(len(reqs))}
    while core.has_work:
        for o in core.step().outputs:
            out[o.rid] += o.token_ids
    return [out[str(i)] for i in range(len(reqs))]


def requests(n: int, seeded: bool) -> list[tuple[str, dict[str, Any]]]:
    params: dict[str, Any] = dict(max_new_tokens=24, ignore_eos=True)
    return [
        (
            PROMPTS[i % len(PROMPTS)],
            {**params, "temperature": 0.9, "top_p": 0.95, "seed": 100 + i}
            if seeded
            else {**params, "temperature": 0.0},
        )
        for i in range(n)
    ]


async def generate_all(engine: rt.Engine, reqs: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    results: list[Any] = [None] * len(reqs)

    async def one(i: int) -> None:
        results[i] = await engine.generate(reqs[i][0], **reqs[i][1])

    async with trio.open_nursery() as nursery:
        for i in range(len(reqs)):
            nursery.start_soon(one, i)
    return results


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
async def test_outputs_equal_the_engine_core_singly_and_64_at_once(tiny_model, seeded) -> None:
    reqs = requests(64, seeded)
    want = core_outputs(tiny_model, reqs)
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        single = await engine.generate(reqs[0][0], **reqs[0][1])
        assert list(single.output_ids) == want[0]
        assert single.finish_reason == "length" and single.meta.completion_tokens == 24
        many = await generate_all(engine, reqs)
    assert [list(o.output_ids) for o in many] == want


async def test_streamed_text_equals_decode_of_all_ids(tiny_model) -> None:
    tokenizer = load_tokenizer(str(tiny_model))
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        for prompt in PROMPTS:
            text, ids, last, seen = "", [], None, []
            async for chunk in engine.stream(prompt, max_new_tokens=20, temperature=0.0):
                text += chunk.text
                ids += chunk.output_ids
                seen.append(text)
                last = chunk
            assert last is not None and last.finish_reason is not None
            final = tokenizer.decode(ids, skip_special_tokens=True)  # the engine's default
            assert text == final
            # Nothing shown early was wrong: half a character shown as U+FFFD and
            # completed later would break this (random tokens can be invalid UTF-8,
            # which the final text shows as U+FFFD too).
            assert all(final.startswith(t) for t in seen)


async def test_every_chunk_says_when_its_step_ended(tiny_model) -> None:
    # Tokens can reach the detokenizer before their stream is opened there (the
    # frontend opens it once it knows the prompt's ids): they wait, and their
    # chunk must still carry their step's time, not 0.
    stamps: list[tuple[float, float]] = []

    async def one(engine: rt.Engine, i: int) -> None:
        async for chunk in engine.stream(
            f"{PROMPTS[i % len(PROMPTS)]} {i}", max_new_tokens=8, ignore_eos=True
        ):
            stamps.append((chunk.stepped_at, time.monotonic()))

    async with (
        rt.open_engine(str(tiny_model), **OPTIONS, load_format="null") as engine,
        trio.open_nursery() as nursery,
    ):
        for i in range(128):
            nursery.start_soon(one, engine, i)
    assert len(stamps) >= 128
    late = [(at, now) for at, now in stamps if not 0 < at <= now]
    assert not late, f"{len(late)} of {len(stamps)} chunks without their step's time"


async def test_stop_strings_cut_the_text_and_free_the_request(tiny_model) -> None:
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        free = await engine.generate(
            PROMPTS[0], max_new_tokens=30, temperature=0.0, ignore_eos=True
        )
        text = free.text
        assert len(text) > 6
        stop = text[3:6]  # most likely spans tokens
        cut = await engine.generate(
            PROMPTS[0], max_new_tokens=30, temperature=0.0, ignore_eos=True, stop=[stop]
        )
        assert cut.text == text[: text.index(stop)]
        assert (cut.finish_reason, cut.matched_stop) == ("stop", stop)
        kept = await engine.generate(
            PROMPTS[0],
            max_new_tokens=30,
            temperature=0.0,
            ignore_eos=True,
            stop=[stop],
            no_stop_trim=True,
        )
        assert kept.text == text[: text.index(stop) + len(stop)]
        assert kept.output_ids == cut.output_ids
        first = await engine.generate(
            PROMPTS[0], max_new_tokens=30, temperature=0.0, ignore_eos=True, stop=text[:1]
        )
        assert (first.text, first.finish_reason) == ("", "stop")


async def test_a_stop_string_that_ends_one_of_n_samples_leaves_the_others_alone(
    tiny_model, caplog: pytest.LogCaptureFixture
) -> None:
    """The scheduler matches no stop strings: it went on with the sample the
    detokenizer had ended, whose later tokens the detokenizer took for a lost
    frame. It parked them (so no step frame after them was committed: under load
    the ring filled and the server stalled) and the request was resumed, the
    other samples with it, by a fresh prefill."""
    budget = 400
    sampling: dict[str, Any] = dict(
        n=2, max_new_tokens=budget, temperature=1.0, seed=3, ignore_eos=True
    )
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        free = await engine.generate(PROMPTS[1], **sampling)
        texts = [c.text for c in free.choices]
        # a stop that ends sample 0 early and sample 1 not at all (or later)
        stop = next(
            texts[0][i : i + 2]
            for i in range(1, len(texts[0]) // 3)
            if texts[0][i : i + 2] not in texts[1][: len(texts[0]) // 3 + 2]
            and texts[0][i : i + 2].strip()
        )
        assert await engine.flush_cache()
        cut = await engine.generate(PROMPTS[1], **sampling, stop=[stop])
        first = cut.choices[0]
        assert (first.text, first.finish_reason) == (texts[0][: texts[0].index(stop)], "stop")
        other = cut.choices[1]
        assert other.text == (texts[1][: texts[1].index(stop)] if stop in texts[1] else texts[1])
        with trio.fail_after(10):  # nothing of it is left in the detokenizer
            await engine.detokenizer_stats(lambda s: s.streams == 0 and s.parked == 0)
        # and the scheduler ended sample 0 at its stop, not at its budget: only what
        # was generated is in the prefix cache (the prompt once, each sample's tokens)
        idle = await engine.scheduler_stats(lambda s: s.running == s.waiting == 0 < s.cached_tokens)
        made_after_a_stop = idle.cached_tokens - cut.meta.prompt_tokens - cut.meta.completion_tokens
        # (sample 0 ran on while sample 1 did, before; a loaded machine's lag is far less)
        assert made_after_a_stop < (len(other.output_ids) - len(first.output_ids)) // 2, idle
    assert not [r for r in caplog.records if "resuming" in r.getMessage()]


async def test_bad_requests_get_clear_errors_and_hurt_nobody(tiny_model) -> None:
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        with pytest.raises(InvalidRequestError, match="temperature"):
            await engine.generate("x", temperature=-1)
        with pytest.raises(InvalidRequestError, match="unknown parameter"):
            await engine.generate("x", max_tokens=3)
        with pytest.raises(rt.errors.ContextOverflowError, match="context length"):
            await engine.generate("x" * 10, max_new_tokens=600)
        context = json.loads((tiny_model / "config.json").read_text())["max_position_embeddings"]
        with pytest.raises(rt.errors.ContextOverflowError, match="2000000 tokens, more than"):
            await engine.generate([5] * 2_000_000, max_new_tokens=4)
        # cut twice: to the context by the frontend, then to the room max_new_tokens leaves
        ids = [7] * 100 + [5] * context
        cut = await engine.generate(ids, max_new_tokens=4, allow_auto_truncate=True)
        assert cut.meta.prompt_tokens == context - 4 and cut.meta.truncated_tokens == 104
        with pytest.raises(InvalidRequestError, match=rf"input_ids\[{100 + context - 1}\]"):
            await engine.generate(input_ids=[*ids[:-1], -1], allow_auto_truncate=True)
        out = await engine.generate("fine", max_new_tokens=4, temperature=0.0)
        assert out.meta.completion_tokens >= 1
        chat = await engine.generate(
            messages=[{"role": "user", "content": "hi"}], max_new_tokens=4, temperature=0.0
        )
        assert chat.meta.prompt_tokens > 3


async def test_unreadable_frames_do_not_crash_the_tokenizer(tiny_model) -> None:
    # The frontend checks each request before sending it, so only corruption
    # puts an unreadable frame in the tokenizer's inbox. Put two there by hand:
    # one whose rid can be read (refused by rid), one that is noise (dropped).
    wrong_type = msgspec.msgpack.encode(
        GenerateRequest("bad-1", text="hi", sampling=SamplingParams(logprobs=2))  # type: ignore[arg-type]
    )
    noise = b"\x93\xa3bad\xc1"
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        for frame in (wrong_type, noise):
            await engine._to_tok[0].send(frame)
        out = await engine.generate("still fine", max_new_tokens=4, temperature=0.0)
        assert out.meta.completion_tokens >= 1
        tokenizer = next(a for a in engine.actors() if a.name == "tokenizer0")
        assert tokenizer.restart_count == 0


def pid_of(engine: rt.Engine, name: str) -> int:
    pid = next(a.pid for a in engine.actors() if a.name == name)
    assert pid is not None
    return pid


async def streams(
    engine: rt.Engine, reqs: list[tuple[str, dict[str, Any]]], on_chunk: Any = None
) -> list[str]:
    texts = [""] * len(reqs)

    async def one(i: int) -> None:
        async for chunk in engine.stream(reqs[i][0], **reqs[i][1]):
            texts[i] += chunk.text
            if on_chunk is not None:
                on_chunk()

    async with trio.open_nursery() as nursery:
        for i in range(len(reqs)):
            nursery.start_soon(one, i)
    return texts


@pytest.mark.slow
@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
@pytest.mark.parametrize("victim", ["tokenizer0", "scheduler", "detokenizer"])
async def test_kill_9_mid_stream_every_request_completes_unchanged(
    tiny_model, victim: str, seeded: bool
) -> None:
    reqs = [(p, {**kw, "max_new_tokens": 64}) for p, kw in requests(16, seeded)]
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        want = await streams(engine, reqs)
        chunks = 0
        killed = False

        def kill_once() -> None:
            nonlocal chunks, killed
            chunks += 1
            # (each stream gives one chunk at least; a reader behind gets the steps it
            # missed as one, so under load a count such as 40 may never come)
            if chunks == len(reqs) and not killed:
                killed = True
                os.kill(pid_of(engine, victim), signal.SIGKILL)

        got = await streams(engine, reqs, kill_once)
        assert killed
        # a tokenizer killed near the last chunk is seen gone after the streams end
        with trio.fail_after(30):
            await engine.supervisor.wait_for(lambda s: s.actor(victim).restart_count > 0)
        status = {a.name: a for a in engine.actors()}
        assert status[victim].restart_count == 1, status[victim]
    assert got == want


@pytest.mark.slow
async def test_overlap_scheduling_through_the_pipeline_and_a_scheduler_kill(tiny_model) -> None:
    """With overlap scheduling (on by default on CUDA, forced here) the scheduler reports
    each step's tokens one step late; outputs equal the core's without it, and a
    SIGKILL of the scheduler mid-decode loses only tokens never reported, drawn again
    the same (seeded sampling is a function of seed and position)."""
    reqs = [(p, {**kw, "max_new_tokens": 40}) for p, kw in requests(6, False) + requests(6, True)]
    want = core_outputs(tiny_model, reqs)
    async with rt.open_engine(str(tiny_model), overlap_schedule=True, **OPTIONS) as engine:
        outs = await generate_all(engine, reqs)
        assert [list(o.output_ids) for o in outs] == want
        want_text = [o.text for o in outs]
        chunks, killed = 0, False

        def kill_once() -> None:
            nonlocal chunks, killed
            chunks += 1
            # (each stream gives one chunk at least; a reader behind gets the steps it
            # missed as one, so under load there may be far fewer: once fewer than 60)
            if chunks == len(reqs) and not killed:
                killed = True
                os.kill(pid_of(engine, "scheduler"), signal.SIGKILL)

        got = await streams(engine, reqs, kill_once)
        assert killed
        with trio.fail_after(60):
            await engine.supervisor.wait_for(lambda s: s.actor("scheduler").restart_count == 1)
    assert got == want_text


@pytest.mark.slow
@pytest.mark.parametrize(
    ("victim", "point", "after"),
    [("tokenizer0", "tokenize", 5), ("scheduler", "step", 8), ("detokenizer", "receive", 6)],
)
async def test_a_fault_plan_kill_mid_stream_loses_nothing(
    tiny_model, tmp_path: Path, victim: str, point: str, after: int
) -> None:
    reqs = [(p, {**kw, "max_new_tokens": 48}) for p, kw in requests(16, seeded=True)]
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        want = await streams(engine, reqs)
    plan = tmp_path / "plan.json"
    rule = {"actor": victim, "point": point, "action": "sigkill", "after": after, "incarnation": 1}
    plan.write_text(json.dumps({"seed": 1, "faults": [rule]}))
    async with rt.open_engine(str(tiny_model), fault_plan=str(plan), **OPTIONS) as engine:
        got = await streams(engine, reqs)
        assert next(a for a in engine.actors() if a.name == victim).restart_count == 1
    assert got == want


async def test_cancelling_a_hundred_requests_frees_every_kv_slot(tiny_model) -> None:
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        started = 0
        with trio.move_on_after(60) as scope:

            async def one(i: int) -> None:
                nonlocal started
                async for _ in engine.stream(
                    PROMPTS[i % 8] + str(i), max_new_tokens=400, ignore_eos=True, temperature=0.0
                ):
                    started += 1
                    if started >= 100:
                        scope.cancel()

            async with trio.open_nursery() as nursery:
                for i in range(100):
                    nursery.start_soon(one, i)
        assert not scope.cancelled_caught or started >= 100
        stats = await engine.scheduler_stats(lambda s: s.running == 0 and s.waiting == 0)
        assert stats.integrity_ok, stats
        assert stats.request_tokens == 0, f"KV still held by requests: {stats}"
        out = await engine.generate("after", max_new_tokens=4, temperature=0.0)
        assert len(out.output_ids) == 4


async def test_an_idle_engine_uses_next_to_no_cpu(tiny_model) -> None:
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        await engine.generate("warm up", max_new_tokens=2)
        pids = [a.pid for a in engine.actors() if a.pid is not None]
        # Idle: the warm-up's tail is done (not a fixed settling time, which a loaded
        # machine may overrun, counting that tail as idle use).
        with trio.fail_after(60):
            await engine.scheduler_stats(
                lambda s: s.steps > 0 and s.running == 0 and s.waiting == 0 and s.requests == 0
            )
            await engine.detokenizer_stats(lambda s: s.streams == 0 and s.parked == 0)
        before = cpu_seconds([os.getpid(), *pids])
        start = time.monotonic()
        await trio.sleep(2)
        used = cpu_seconds([os.getpid(), *pids]) - before
        elapsed = time.monotonic() - start
    assert used < 0.1 * elapsed, f"idle engine used {used:.2f} s of CPU in {elapsed:.1f} s"


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


async def test_two_tokenizer_workers_n_samples_logprobs_and_stop_tokens(tiny_model) -> None:
    reqs = requests(12, seeded=True)
    want = core_outputs(tiny_model, reqs)
    async with rt.open_engine(str(tiny_model), tokenizer_workers=2, **OPTIONS) as engine:
        assert {a.name for a in engine.actors()} >= {"tokenizer0", "tokenizer1"}
        outs = await generate_all(engine, reqs)  # round-robin over both workers
        assert [list(o.output_ids) for o in outs] == want
        multi = await engine.generate(
            PROMPTS[1],
            n=3,
            max_new_tokens=12,
            temperature=1.0,
            seed=5,
            ignore_eos=True,
            logprobs=True,
            top_logprobs=2,
        )
        assert len(multi.choices) == 3 and len({c.output_ids for c in multi.choices}) > 1
        for choice in multi.choices:
            assert len(choice.output_ids) == 12
            assert choice.logprobs is not None and len(choice.logprobs) == 12
            assert all(lp <= 0.0 for lp in choice.logprobs)
            assert choice.top_logprobs is not None and all(len(t) == 2 for t in choice.top_logprobs)
        stop_id = want[0][5]
        cut = await engine.generate(reqs[0][0], **{**reqs[0][1], "stop_token_ids": [stop_id]})
        first = want[0].index(stop_id)
        assert list(cut.output_ids) == want[0][: first + 1]  # the stop token is included
        assert (cut.finish_reason, cut.matched_stop) == ("stop", stop_id)


async def test_requests_go_around_a_tokenizer_worker_that_shows_no_sign_of_life(
    tiny_model,
) -> None:
    """With a worker stopped (SIGSTOP: a hung process), every other request went
    to it and waited for the stall watch (10 s, then again to the same worker);
    then, until it had been silent for SILENT_AFTER_S (5 s). The running workers
    take them all DOWN_CHECK_S after the signal, as the kernel tells it (seen_down)."""
    async with rt.open_engine(str(tiny_model), tokenizer_workers=2, **OPTIONS) as engine:
        pid = engine.supervisor.status().actor("tokenizer1").pid or 0
        want = await engine.generate(PROMPTS[0], max_new_tokens=4, temperature=0.0)
        os.kill(pid, signal.SIGSTOP)
        try:
            await trio.sleep(2 * DOWN_CHECK_S)  # (the last look at it may be that old)
            with trio.fail_after(8):  # (each waited 10 s or more when it was sent there)
                for _ in range(4):
                    out = await engine.generate(PROMPTS[0], max_new_tokens=4, temperature=0.0)
                    assert out.output_ids == want.output_ids
        finally:
            os.kill(pid, signal.SIGCONT)


@pytest.mark.slow
async def test_a_new_request_waits_for_a_restarting_actor_but_not_forever(
    tiny_model, tmp_path: Path
) -> None:
    plan = tmp_path / "plan.json"  # the second tokenizer hangs in its start-up
    rule = {
        "actor": "tokenizer0",
        "point": "startup",
        "action": "hang",
        "hang": "sleep",
        "incarnation": 2,
    }
    plan.write_text(json.dumps({"seed": 1, "faults": [rule]}))
    async with rt.open_engine(
        str(tiny_model), fault_plan=str(plan), restart_wait_timeout=1.0, **OPTIONS
    ) as engine:
        await engine.generate("before", max_new_tokens=2)
        os.kill(pid_of(engine, "tokenizer0"), signal.SIGKILL)
        await engine.supervisor.wait_for(
            lambda s: s.actor("tokenizer0").state is not rt.actors.ActorState.RUNNING
        )
        start = time.monotonic()
        with pytest.raises(rt.errors.ServiceUnavailableError, match="tokenizer0"):
            await engine.generate("during", max_new_tokens=2)
        assert 0.9 < time.monotonic() - start < 10


@pytest.mark.slow
async def test_a_request_the_dead_scheduler_took_before_the_frontend_knew_its_ids(
    tiny_model, tmp_path: Path
) -> None:
    """The scheduler admits a request (and commits its frame), then dies; the
    frontend learns the prompt's ids only after the restart, so the restart
    could not resubmit it: the late ids must."""
    plan = tmp_path / "plan.json"
    rules = [  # the tokenizer's 2nd send (ids to the frontend) is late; the scheduler dies
        {"actor": "tokenizer0", "point": "send", "action": "delay", "delay_ms": 8000, "after": 1},
        {"actor": "scheduler", "point": "step", "action": "sigkill", "incarnation": 1},
    ]
    plan.write_text(json.dumps({"seed": 1, "faults": rules}))
    ((prompt, params),) = requests(1, seeded=False)
    (want,) = core_outputs(tiny_model, [(prompt, params)])
    async with rt.open_engine(str(tiny_model), fault_plan=str(plan), **OPTIONS) as engine:
        with trio.fail_after(60):
            out = await engine.generate(prompt, **params)
        assert list(out.output_ids) == want
        assert next(a for a in engine.actors() if a.name == "scheduler").restart_count == 1


@pytest.mark.slow
async def test_max_new_tokens_none_fills_the_context_across_a_scheduler_kill(
    tiny_model, tmp_path: Path
) -> None:
    """``max_new_tokens=None`` (OpenAI's chat default) is the room the prompt
    leaves: the tokenizer sets it, and the frontend's table keeps it, so the
    scheduler that resumes the request after a kill gives the same tokens."""
    reqs = [("The quick brown fox", {"max_new_tokens": None, "ignore_eos": True, "seed": 5})]
    # (the model's context is 512: a third of the steps; each 5 ms longer, so that a
    # reader behind under the full suite does not get the ~75 tokens of the second
    # engine as one chunk, before any kill: it did once)
    slow = {"actor": "scheduler", "point": "step", "action": "delay", "delay_ms": 5, "times": 0}
    plan = tmp_path / "slow.json"
    plan.write_text(json.dumps({"seed": 1, "faults": [slow]}))
    options = {**OPTIONS, "context_length": 160, "fault_plan": str(plan)}
    async with rt.open_engine(str(tiny_model), **options) as engine:
        out = await engine.generate(*reqs[0][:1], **reqs[0][1])
        assert out.meta.completion_tokens == 160 - out.meta.prompt_tokens
        assert out.finish_reason == "length"
        want = await streams(engine, reqs)
        chunks = 0

        def kill_once() -> None:
            nonlocal chunks
            chunks += 1
            if chunks == 2:  # (a reader behind gets the steps it missed as one chunk:
                # under the full suite a stream of ~150 tokens once came in 8)
                os.kill(pid_of(engine, "scheduler"), signal.SIGKILL)

        got = await streams(engine, reqs, kill_once)
        assert chunks >= 2
        with trio.fail_after(60):
            await engine.supervisor.wait_for(lambda s: s.actor("scheduler").restart_count == 1)
        assert got == want == [out.text]
    # a KV pool smaller than the context: the room is the pool's, cut by the scheduler
    # (it was refused), and the same cut again for the one that resumes it
    async with rt.open_engine(str(tiny_model), **{**options, "max_total_tokens": 80}) as engine:
        out = await engine.generate(*reqs[0][:1], **reqs[0][1])
        assert out.meta.prompt_tokens + out.meta.completion_tokens == 80
        chunks = 0
        got = await streams(engine, reqs, kill_once)
        assert chunks >= 2 and got == [out.text]
        with pytest.raises(rt.errors.ContextOverflowError, match="room for 0 new tokens"):
            await engine.generate([7] * 100, max_new_tokens=None)
        with pytest.raises(InvalidRequestError, match="priority: the schedule policy is 'fcfs'"):
            await engine.generate("hi", priority=2)
        with pytest.raises(rt.errors.ContextOverflowError, match="no room for an answer"):
            await engine.generate([7] * 160, max_new_tokens=None)

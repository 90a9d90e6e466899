"""Overlap scheduling: step N + 1 is launched before step N's tokens are read back.

On the CPU every op is synchronous, so nothing overlaps in time, but every line of
the bookkeeping runs: tokens not read yet stand in the outputs as placeholders, the
next batch takes them from the device, and a request that stops is found one step
late. Every output must be the same, token for token, with and without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gpu_testlib import drain, make_engine, prompts, run_all

from rt.gpu import EngineConfig, SamplingParams


def both(path: Path, reqs: dict[str, tuple[list[int], SamplingParams]], **kw: Any) -> tuple:
    """The outputs of ``reqs`` without, then with, overlap scheduling."""
    runs = []
    for overlap in (False, True):
        engine = make_engine(path, overlap_schedule=overlap, **kw)
        assert engine.overlap is overlap
        runs.append(run_all(engine, reqs))
        if kw.get("max_total_tokens", 4096) < 100:  # a pool meant to be too small
            assert engine.num_retractions > 0
    return tuple(runs)


def outputs(results: dict[str, dict[str, Any]]) -> dict[str, tuple]:
    """What a user sees of each request but its logprobs: tokens, finish and counts."""
    seen = {}
    for key, r in results.items():
        final = r["final"]
        seen[key] = (
            r["tokens"],
            [[t for t, _ in top] for top in r["top"]],
            final.finish_reason,
            final.matched_stop,
            final.completion_tokens,
        )
    return seen


def logprobs(results: dict[str, dict[str, Any]]) -> list[float]:
    """Every logprob reported, sampled, alternative and prompt ones, in one list."""
    values: list[float] = []
    for _, r in sorted(results.items()):
        values += r["logprobs"] + [lp for top in r["top"] for _, lp in top]
        values += r["final"].prompt_logprobs or []
    return values


@pytest.mark.parametrize(
    ("backend", "deterministic"),
    [("torch", False), ("triton", True)],
    ids=["torch", "batch-invariant"],
)
def test_greedy_seeded_penalties_filters_and_logprobs_are_the_same(
    checkpoints: dict[str, Path], backend: str, deterministic: bool
) -> None:
    path = checkpoints["llama"]
    ps = prompts(8, [12, 30, 7, 22, 16, 9, 40, 5], seed=11)
    # one greedy run only to learn a token the greedy request really emits: its stop id
    first = run_all(
        make_engine(path),
        {"g": (ps[0], SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True))},
    )
    tokens = first["g"]["tokens"]
    stop_at = next(t for t in tokens[3:] if t not in tokens[:3])
    params = [
        SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=(stop_at,)),
        SamplingParams(temperature=0.9, seed=7, max_new_tokens=20, ignore_eos=True),
        SamplingParams(
            temperature=0.7, seed=8, frequency_penalty=0.5, presence_penalty=0.3,
            repetition_penalty=1.2, max_new_tokens=18, ignore_eos=True,
        ),
        SamplingParams(temperature=1.0, seed=9, top_k=5, top_p=0.8, min_p=0.05, max_new_tokens=15),
        SamplingParams(temperature=0.0, max_new_tokens=10, min_new_tokens=8, logprobs=True,
                       top_logprobs=3),
        SamplingParams(temperature=0.8, seed=10, max_new_tokens=1, ignore_eos=True),
        SamplingParams(temperature=0.0, max_new_tokens=12, prompt_logprobs=True, top_logprobs=2,
                       ignore_eos=True),
        SamplingParams(temperature=0.6, seed=12, n=2, max_new_tokens=14, ignore_eos=True),
    ]  # fmt: skip
    reqs = {f"r{i}": (p, sp) for i, (p, sp) in enumerate(zip(ps, params, strict=True))}
    plain, overlapped = both(path, reqs, attention_backend=backend, deterministic=deterministic)
    assert outputs(overlapped) == outputs(plain)
    if deterministic:
        assert logprobs(overlapped) == logprobs(plain)
    else:
        # a request that stops decodes once more with overlap, so a step's batch may hold
        # one more row, and float32 matmuls round by batch size: ~1e-6 apart
        assert logprobs(overlapped) == pytest.approx(logprobs(plain), abs=1e-4)
    assert len(logprobs(plain)) > 40
    assert plain["r0"]["final"].finish_reason == "stop"  # the stop is found a step late
    assert len(plain) == 9  # r7 has two children


@pytest.mark.parametrize("page_size", [1, 16])
def test_chunked_prefill_and_retraction_are_the_same(
    checkpoints: dict[str, Path], page_size: int
) -> None:
    path = checkpoints["mistral"]
    ps = prompts(6, [10, 25, 14, 30, 8, 19], seed=21)
    reqs = {
        f"r{i}": (
            p,
            SamplingParams(
                max_new_tokens=24, ignore_eos=True, temperature=0.0 if i % 2 else 0.8, seed=i
            ),
        )
        for i, p in enumerate(ps)
    }
    big, big_overlapped = both(path, reqs, page_size=page_size, chunked_prefill_size=16)
    assert outputs(big_overlapped) == outputs(big)
    pool = 64 if page_size == 1 else 80
    small, small_overlapped = both(path, reqs, page_size=page_size, max_total_tokens=pool)
    assert outputs(small_overlapped) == outputs(small) == outputs(big)


def test_the_first_step_reports_nothing_and_the_last_reports_the_rest(
    checkpoints: dict[str, Path],
) -> None:
    engine = make_engine(checkpoints["qwen2"], overlap_schedule=True)
    engine.add_request(
        "a", prompts(1, [9], seed=3)[0], SamplingParams(max_new_tokens=3, ignore_eos=True)
    )
    first = engine.step()
    assert first.forward_mode == "extend" and first.outputs == [] and engine.has_pending
    steps = [engine.step() for _ in range(3)]
    assert [len(s.outputs) for s in steps] == [1, 1, 1]
    assert steps[-1].forward_mode == "idle" and steps[-1].outputs[0].finish_reason == "length"
    assert not engine.has_work
    engine.check_integrity()


@pytest.mark.parametrize("command", ["abort", "finish"])
def test_a_command_while_a_step_is_pending_reports_every_token_first(
    checkpoints: dict[str, Path], command: str
) -> None:
    path = checkpoints["qwen3"]
    p = prompts(1, [11], seed=4)[0]
    params = SamplingParams(temperature=0.0, max_new_tokens=30, ignore_eos=True)
    want = run_all(make_engine(path), {"a": (p, params)})["a"]["tokens"]
    engine = make_engine(path, overlap_schedule=True)
    engine.add_request("a", p, params)
    got = drain(engine, max_steps=5)["a"]["tokens"]
    assert engine.has_pending
    getattr(engine, command)("a")
    out = engine.apply_commands()  # as a paused scheduler does
    got += [t for o in out.outputs for t in o.token_ids]
    assert out.outputs[-1].finish_reason == command
    assert out.outputs[-1].completion_tokens == len(got) == 5
    assert got == want[:5]
    assert not engine.has_work
    engine.check_integrity()


def test_overlap_is_on_for_cuda_only_unless_asked(checkpoints: dict[str, Path]) -> None:
    assert not EngineConfig(model_path=checkpoints["llama"]).use_overlap
    assert EngineConfig(model_path=checkpoints["llama"], device="cuda").use_overlap
    cfg = EngineConfig(model_path=checkpoints["llama"], device="cuda", overlap_schedule=False)
    assert not cfg.use_overlap


def test_null_model_requests_end_the_same(checkpoints: dict[str, Path]) -> None:
    reqs = {
        f"n{i}": (p, SamplingParams(max_new_tokens=4 + i, ignore_eos=True))
        for i, p in enumerate(prompts(5, [8, 3, 12, 6, 9], seed=2))
    }
    runs = [
        run_all(make_engine(checkpoints["llama"], load_format="null", overlap_schedule=o), reqs)
        for o in (False, True)
    ]
    assert outputs(runs[1]) == outputs(runs[0])

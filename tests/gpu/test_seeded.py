"""Seeded sampling is a pure function of (seed, request, position)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from gpu_testlib import make_engine, prompts, run_all

from rt.gpu import SamplingParams

NEW = 16


def sampled(seed: int, **kwargs: object) -> SamplingParams:
    base: dict[str, object] = dict(
        temperature=0.9, top_k=50, top_p=0.95, min_p=0.01, max_new_tokens=NEW, seed=seed
    )
    base.update(kwargs)
    return SamplingParams(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def target() -> list[int]:
    return prompts(1, [29], seed=11)[0]


def test_seed_independent_of_batch_chunking_and_pages(
    checkpoints: dict[str, Path], target: list[int]
) -> None:
    path = checkpoints["llama"]
    alone = run_all(make_engine(path), {"x": (target, sampled(7))})["x"]["tokens"]
    assert len(alone) == NEW or alone[-1] == 2
    others = prompts(4, [5, 44, 13, 21], seed=12)
    for page_size, chunk in [(1, None), (16, 8), (1, 5)]:
        engine = make_engine(path, page_size=page_size, chunked_prefill_size=chunk)
        reqs = {f"o{i}": (p, sampled(100 + i, temperature=1.3)) for i, p in enumerate(others)}
        reqs["x"] = (target, sampled(7))
        assert run_all(engine, reqs)["x"]["tokens"] == alone, (page_size, chunk)
    # a different seed gives a different sequence
    assert run_all(make_engine(path), {"x": (target, sampled(8))})["x"]["tokens"] != alone


def test_same_seed_across_requests_in_one_batch(
    checkpoints: dict[str, Path], target: list[int]
) -> None:
    engine = make_engine(checkpoints["qwen2"])
    res = run_all(
        engine, {"a": (target, sampled(5)), "b": (target, sampled(5)), "c": (target, sampled(6))}
    )
    assert res["a"]["tokens"] == res["b"]["tokens"]


def test_unseeded_request_reports_its_seed(checkpoints: dict[str, Path], target: list[int]) -> None:
    path = checkpoints["llama"]
    params = sampled(0, ignore_eos=True)
    unseeded = dataclasses.replace(params, seed=None)
    first = run_all(make_engine(path, seed=1), {"x": (target, unseeded)})["x"]
    again = dataclasses.replace(params, seed=first["final"].seed)
    assert run_all(make_engine(path), {"x": (target, again)})["x"]["tokens"] == first["tokens"]


def test_n_children_share_prompt_prefix(checkpoints: dict[str, Path], target: list[int]) -> None:
    engine = make_engine(checkpoints["qwen3"])
    res = run_all(engine, {"x": (target, sampled(3, n=3, ignore_eos=True))})
    seqs = [res[k]["tokens"] for k in ("x", "x#1", "x#2")]
    assert all(len(s) == NEW for s in seqs)
    assert len({tuple(s) for s in seqs}) == 3  # different seeds per child
    assert res["x"]["final"].cached_tokens == 0
    assert res["x#1"]["final"].cached_tokens == len(target) - 1
    assert res["x#2"]["final"].cached_tokens == len(target) - 1
    # child 0 keeps the request's seed: equal to an n=1 run with that seed
    single = run_all(
        make_engine(checkpoints["qwen3"]), {"y": (target, sampled(3, ignore_eos=True))}
    )
    assert single["y"]["tokens"] == seqs[0]

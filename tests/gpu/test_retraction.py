"""A KV pool too small for the whole batch: requests are retracted and resumed, never lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_testlib import make_engine, prompts, run_all

from rt.errors import ContextOverflowError
from rt.gpu import SamplingParams


@pytest.mark.parametrize("page_size", [1, 16])
def test_retraction_matches_big_pool(checkpoints: dict[str, Path], page_size: int) -> None:
    path = checkpoints["mistral"]
    ps = prompts(6, [10, 25, 14, 30, 8, 19], seed=21)
    reqs = {}
    for i, p in enumerate(ps):
        params = SamplingParams(
            max_new_tokens=24, ignore_eos=True, temperature=0.0 if i % 2 else 0.8, seed=i
        )
        reqs[f"r{i}"] = (p, params)
    big = run_all(make_engine(path, page_size=page_size), reqs)
    tiny = make_engine(path, page_size=page_size, max_total_tokens=64 if page_size == 1 else 80)
    small = run_all(tiny, reqs)
    assert tiny.num_retractions > 0
    for rid in reqs:
        assert small[rid]["tokens"] == big[rid]["tokens"], rid
        assert small[rid]["final"].finish_reason == "length"


def test_request_that_can_never_fit_is_refused(checkpoints: dict[str, Path]) -> None:
    engine = make_engine(checkpoints["llama"], max_total_tokens=64)
    with pytest.raises(ContextOverflowError, match="KV pool"):
        engine.add_request("big", list(range(3, 50)), SamplingParams(max_new_tokens=20))
    with pytest.raises(ContextOverflowError, match="context length"):
        make_engine(checkpoints["llama"]).add_request(
            "long", [5] * 500, SamplingParams(max_new_tokens=20)
        )
    assert not engine.has_work
    engine.check_integrity()


def test_request_that_exactly_fits_the_pool_runs_alone(checkpoints: dict[str, Path]) -> None:
    """17 + 15 tokens in a 2-page pool: admission must not demand a decode reserve on top."""
    engine = make_engine(checkpoints["llama"], page_size=16, max_total_tokens=32)
    ps = prompts(2, [17, 17], seed=22)
    res = run_all(
        engine,
        {
            f"r{i}": (p, SamplingParams(max_new_tokens=15, ignore_eos=True, seed=i))
            for i, p in enumerate(ps)
        },
    )
    assert all(len(r["tokens"]) == 15 for r in res.values())

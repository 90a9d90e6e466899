"""A KV pool too small for the whole batch: requests are retracted and resumed, never lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_testlib import drain, make_engine, prompts, run_all

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
    # the prompt alone: no max_new_tokens would fit it (the advice was to lower that)
    with pytest.raises(ContextOverflowError, match=r"more than the KV pool.*shorten the prompt"):
        engine.add_request("huge", list(range(3, 80)), SamplingParams(max_new_tokens=1))
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


@pytest.mark.parametrize("after_steps", [1, 6])
def test_retract_all_gives_back_every_kv_and_the_requests_end_as_they_would_have(
    checkpoints: dict[str, Path], after_steps: int
) -> None:
    """A retracting pause (SGLang's mode retract): between two steps every admitted
    request, running or half prefilled (chunked), gives back its KV; a flush then
    empties the pool, and each computes its KV again and draws the same tokens."""
    path = checkpoints["mistral"]
    ps = prompts(4, [40, 25, 14, 30], seed=23)
    reqs = {
        f"r{i}": (p, SamplingParams(max_new_tokens=12, ignore_eos=True, seed=i))
        for i, p in enumerate(ps)
    }
    want = run_all(make_engine(path, chunked_prefill_size=32), reqs)
    engine = make_engine(path, chunked_prefill_size=32)
    for rid, (ids, params) in reqs.items():
        engine.add_request(rid, ids, params)
    results = drain(engine, max_steps=after_steps)
    assert engine.running or engine.chunked is not None
    for o in engine.apply_commands().outputs:  # (the last step's draw, with overlap)
        empty = {"tokens": [], "logprobs": [], "top": [], "final": None}
        results.setdefault(o.rid, empty)["tokens"].extend(o.token_ids)
    assert engine.retract_all() > 0
    assert not engine.holds_kv and not engine.running and engine.chunked is None
    engine.check_integrity()
    engine.flush_cache()
    assert engine.cache.tree.evictable_size == 0
    drain(engine, results=results)
    assert not engine.has_work
    for rid in reqs:
        assert results[rid]["tokens"] == want[rid]["tokens"], rid


def test_a_full_pool_with_a_draw_pending_frees_its_ended_requests_kv_first(
    checkpoints: dict[str, Path],
) -> None:
    """With overlap, requests that the pending draw ends by their length are out of
    the running batch but hold their KV until it is read: a pool short of a page
    retracted down to one request, found none free, and the scheduler crashed on
    "decode allocation failed after retraction" (overlap is the default on CUDA)."""
    config = dict(
        page_size=4,
        enable_prefix_cache=False,
        overlap_schedule=True,
        chunked_prefill_size=32,
        max_total_tokens=192,
        schedule_policy="priority",
        max_running_requests=3,
    )
    ps = prompts(3, [53, 56, 45], seed=1491)
    reqs = {
        f"r{i}": (p, SamplingParams(max_new_tokens=m, ignore_eos=True, seed=1, n=n))
        for i, (p, m, n) in enumerate(zip(ps, [15, 12, 19], [3, 2, 2], strict=True))
    }
    got = run_all(make_engine(checkpoints["llama"], **config), reqs)
    want = run_all(make_engine(checkpoints["llama"], max_total_tokens=4096), reqs)
    assert {k: r["tokens"] for k, r in got.items()} == {k: r["tokens"] for k, r in want.items()}

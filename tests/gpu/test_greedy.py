"""Greedy tokens and logprobs equal transformers' on tiny random checkpoints (float32, CPU)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_testlib import ARCHS, drain, greedy, hf_greedy, make_engine, prompts, run_all

LENGTHS = [5, 23, 40, 17]
NEW = 12


@pytest.fixture(scope="module")
def references(hf_models: dict[str, Any]) -> Any:
    @cache
    def ref(arch: str, prompt: tuple[int, ...], new: int = NEW) -> list[int]:
        return hf_greedy(hf_models[arch], list(prompt), new)

    return ref


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize(("page_size", "chunk"), [(1, None), (1, 7), (16, None), (16, 7)])
def test_greedy_batch_matches_transformers(
    arch: str, page_size: int, chunk: int | None, checkpoints: dict[str, Path], references: Any
) -> None:
    ps = prompts(len(LENGTHS), LENGTHS, seed=1)
    engine = make_engine(checkpoints[arch], page_size=page_size, chunked_prefill_size=chunk)
    res = run_all(engine, {f"r{i}": (p, greedy(NEW)) for i, p in enumerate(ps)})
    for i, p in enumerate(ps):
        assert res[f"r{i}"]["tokens"] == references(arch, tuple(p)), (
            f"request {i} (prompt {len(p)})"
        )


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_single_request_and_radix_hit(
    arch: str, page_size: int, checkpoints: dict[str, Path], references: Any
) -> None:
    engine = make_engine(checkpoints[arch], page_size=page_size)
    shared = prompts(1, [45], seed=2)[0]
    first, second = [*shared, 7, 8, 9], [*shared, 10, 11]
    res1 = run_all(engine, {"a": (first, greedy(NEW))})
    assert res1["a"]["tokens"] == references(arch, tuple(first))
    assert res1["a"]["final"].cached_tokens == 0
    res2 = run_all(engine, {"b": (second, greedy(NEW))})
    assert res2["b"]["tokens"] == references(arch, tuple(second))
    assert res2["b"]["final"].cached_tokens == 45 - 45 % page_size
    # the same prompt again: everything but the last token comes from the cache
    res3 = run_all(engine, {"c": (second, greedy(NEW))})
    assert res3["c"]["tokens"] == res2["b"]["tokens"]
    assert res3["c"]["final"].cached_tokens >= 32
    assert engine.flush_cache() > 0
    engine.check_integrity()
    assert engine.cache.tree.total_size == 0


@pytest.mark.parametrize("arch", list(ARCHS))
def test_logprobs_match_transformers(
    arch: str, checkpoints: dict[str, Path], hf_models: dict[str, Any]
) -> None:
    ps = prompts(2, [9, 30], seed=3)
    engine = make_engine(checkpoints[arch])
    params = greedy(6, logprobs=True, top_logprobs=3, ignore_eos=True)
    res = run_all(engine, {f"r{i}": (p, params) for i, p in enumerate(ps)})
    for i, p in enumerate(ps):
        out = res[f"r{i}"]
        seq = torch.tensor([p + out["tokens"]])
        with torch.no_grad():
            logits = hf_models[arch](seq).logits[0].float()
        ref = torch.log_softmax(logits, dim=-1)[len(p) - 1 : -1]  # [new, vocab]
        chosen = ref.gather(1, torch.tensor(out["tokens"])[:, None])[:, 0]
        assert torch.allclose(torch.tensor(out["logprobs"]), chosen, atol=1e-4)
        top = ref.topk(3, dim=-1)
        assert [[t for t, _ in row] for row in out["top"]] == top.indices.tolist()
        got_top = torch.tensor([[lp for _, lp in row] for row in out["top"]])
        assert torch.allclose(got_top, top.values, atol=1e-4)


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_greedy_stream_of_arrivals(
    checkpoints: dict[str, Path], references: Any, prefix_cache: bool
) -> None:
    """Requests arriving while others decode, with a small prefill budget, still match."""
    ps = prompts(5, [12, 33, 8, 27, 19], seed=4)
    ps[3] = ps[1][:20] + ps[3][:7]  # shares 20 tokens with a running request
    engine = make_engine(
        checkpoints["llama"],
        max_prefill_tokens=24,
        chunked_prefill_size=16,
        enable_prefix_cache=prefix_cache,
    )
    for i, p in enumerate(ps[:2]):
        engine.add_request(f"r{i}", p, greedy(NEW))
    res = drain(engine, max_steps=3)
    for i, p in enumerate(ps[2:], start=2):
        engine.add_request(f"r{i}", p, greedy(NEW))
    res = drain(engine, results=res)
    assert not engine.has_work
    stats = engine.stats()
    assert stats.num_running == stats.num_waiting == 0
    assert (
        stats.cached_tokens
        == stats.evictable_tokens
        == (stats.cached_tokens if prefix_cache else 0)
    )
    assert stats.free_tokens + stats.cached_tokens == stats.max_total_tokens
    assert (res["r3"]["final"].cached_tokens >= 16) == prefix_cache
    for i, p in enumerate(ps):
        assert res[f"r{i}"]["tokens"] == references("llama", tuple(p))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_on_cuda_matches_transformers(
    arch: str, checkpoints: dict[str, Path], references: Any
) -> None:
    ps = prompts(len(LENGTHS), LENGTHS, seed=1)
    engine = make_engine(checkpoints[arch], device="cuda", page_size=16, chunked_prefill_size=7)
    res = run_all(engine, {f"r{i}": (p, greedy(NEW)) for i, p in enumerate(ps)})
    for i, p in enumerate(ps):
        assert res[f"r{i}"]["tokens"] == references(arch, tuple(p))


DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "rt" / "assets" / "default_model"


@pytest.mark.skipif(
    not (DEFAULT_MODEL / "config.json").is_file(), reason="no default model shipped"
)
def test_default_model_matches_transformers() -> None:
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(
        DEFAULT_MODEL, dtype=torch.float32
    ).eval()
    ps = prompts(3, [6, 31, 18], seed=5)
    engine = make_engine(DEFAULT_MODEL, page_size=16, chunked_prefill_size=16)
    res = run_all(engine, {f"r{i}": (p, greedy(16)) for i, p in enumerate(ps)})
    for i, p in enumerate(ps):
        assert res[f"r{i}"]["tokens"] == hf_greedy(hf, p, 16)


@pytest.mark.parametrize(("page_size", "chunk"), [(1, None), (16, 7)])
def test_prompt_logprobs_match_transformers_even_with_the_prompt_cached(
    page_size: int, chunk: int | None, checkpoints: dict[str, Path], hf_models: dict[str, Any]
) -> None:
    (p,) = prompts(1, [30], seed=5)
    engine = make_engine(checkpoints["llama"], page_size=page_size, chunked_prefill_size=chunk)
    run_all(engine, {"warm": (p, greedy(2))})  # the prompt is in the prefix cache now
    with torch.no_grad():
        ref = torch.log_softmax(hf_models["llama"](torch.tensor([p])).logits[0].float(), dim=-1)
    want = ref[:-1].gather(1, torch.tensor(p[1:])[:, None])[:, 0]
    top = ref[:-1].topk(2, dim=-1)
    params = greedy(4, prompt_logprobs=True, top_logprobs=2, n=2, ignore_eos=True)
    engine.add_request("a", p, params)
    reports = []
    while engine.has_work:
        reports += [o for o in engine.step().outputs if o.prompt_logprobs is not None]
        engine.check_integrity()
    (report,) = reports  # once per request (its first child's first token), not per child
    assert report.index == 0 and report.token_offset == 0
    assert torch.allclose(torch.tensor(report.prompt_logprobs), want, atol=1e-4)
    assert report.prompt_top_logprobs is not None
    assert [[t for t, _ in alts] for alts in report.prompt_top_logprobs] == top.indices.tolist()
    assert report.cached_tokens == 0  # computed, not taken from the cache
    # without the ask, the same prompt comes from the cache and reports none
    res = run_all(engine, {"b": (p, greedy(2))})
    assert res["b"]["final"].cached_tokens > 0 and res["b"]["final"].prompt_logprobs is None

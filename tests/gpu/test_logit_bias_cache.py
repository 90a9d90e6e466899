"""logit_bias is made once per request and reused: the same tokens as a per-step rebuild,
the right rows biased as the batch changes, and nothing kept once requests finish."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_testlib import VOCAB, make_engine, prompts, run_all

from rt.gpu import sampler
from rt.gpu.sampler import SampleRow, sample
from rt.gpu.sampling_params import SamplingParams


def rebuilt_bias(
    params: Sequence[SamplingParams], bs: int, vocab: int, device: torch.device
) -> torch.Tensor:
    """The reference: the bias as the sampler built it before, per row and step."""
    bias = torch.zeros(bs, vocab, device=device)
    for i, p in enumerate(params):
        if p.logit_bias:
            values = [float(v) for v in p.logit_bias.values()]
            bias[i, list(p.logit_bias)] = torch.tensor(values, device=device)
    return bias


def full_bias(draw: int, vocab: int, **kwargs: Any) -> SamplingParams:
    """A bias on every token id, in random order, of random size (from ``draw``)."""
    g = torch.Generator().manual_seed(draw)
    ids = torch.randperm(vocab, generator=g).tolist()
    values = (torch.rand(vocab, generator=g, dtype=torch.float64) * 10 - 5).tolist()
    return SamplingParams(logit_bias=dict(zip(ids, values, strict=True)), **kwargs)


def test_sampled_tokens_match_the_rebuild_as_rows_join_and_leave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vocab = 300
    a = full_bias(1, vocab, temperature=0.9, top_p=0.9, logprobs=True, top_logprobs=3)
    b = SamplingParams(temperature=0.0, logit_bias={17: 100.0, 250: -3.5})  # forces 17
    c = SamplingParams(temperature=0.7, top_k=20)  # no bias
    d = full_bias(2, vocab, temperature=0.0)
    # one request's rows come, go and change places from step to step, as in the engine
    batches = [[a, a, c], [c, b, a, d], [b], [a, b, b, c, a, d], [c], [d, a]]
    g = torch.Generator().manual_seed(3)
    for step, batch in enumerate(batches):
        logits = torch.randn(len(batch), vocab, generator=g) * 3
        rows = [SampleRow(p, seed=11 + i, position=step, input_ids=[], output_ids=[],
                          suppress_ids=[]) for i, p in enumerate(batch)]  # fmt: skip
        dev = logits.device
        cached = sampler._dense_bias(batch, len(batch), vocab, dev)
        assert torch.equal(logits + cached, logits + rebuilt_bias(batch, len(batch), vocab, dev))
        got = sample(logits, rows)
        with monkeypatch.context() as m:
            m.setattr(sampler, "_dense_bias", rebuilt_bias)
            assert sample(logits, rows) == got, step
        for i, p in enumerate(batch):
            if p is b:
                assert got.token_ids[i] == 17
            if p is d:  # greedy: the best of logits + bias, the bias where it belongs
                best = logits[i] + torch.tensor([d.logit_bias[t] for t in range(vocab)])
                assert got.token_ids[i] == int(best.argmax())


def test_engine_outputs_match_the_rebuild(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = checkpoints["llama"]
    p0, p1, p2 = prompts(3, [9, 14, 5], seed=21)

    def run() -> dict[str, dict[str, Any]]:
        reqs = {
            # n children share one params object, and so one cached bias
            "many": (p0, full_bias(5, VOCAB, n=3, seed=4, max_new_tokens=12, logprobs=True)),
            "plain": (p1, SamplingParams(seed=6, max_new_tokens=5, ignore_eos=True)),
            "pinned": (p2, SamplingParams(temperature=0.0, max_new_tokens=4, logit_bias={40: 100})),
        }
        return run_all(make_engine(path, max_running_requests=3), reqs)

    cached = run()
    with monkeypatch.context() as m:
        m.setattr(sampler, "_dense_bias", rebuilt_bias)
        rebuilt = run()
    assert {k: (r["tokens"], r["logprobs"]) for k, r in cached.items()} == {
        k: (r["tokens"], r["logprobs"]) for k, r in rebuilt.items()
    }
    assert cached["pinned"]["tokens"] == [40] * 4
    # max_running_requests=3: "pinned" and a child of "many" join the batch as others leave
    assert set(cached) == {"many", "many#1", "many#2", "plain", "pinned"}


def test_cached_biases_go_when_requests_finish(checkpoints: dict[str, Path]) -> None:
    gc.collect()
    before = set(sampler._ON_DEVICE)
    engine = make_engine(checkpoints["qwen2"])
    target = prompts(1, [7], seed=8)[0]
    for i in range(6):
        params = full_bias(i, VOCAB, n=2, seed=i, max_new_tokens=3 + i)
        engine.add_request(f"r{i}", target, params)
    engine.step()  # the prefills: each request's bias is made
    assert len(set(sampler._ON_DEVICE) - before) > 0
    while engine.has_work:
        engine.step()
    del params
    gc.collect()
    assert set(sampler._ON_DEVICE) - before == set()
    # nor does a request whose params only the engine held
    res = run_all(engine, {"again": (target, full_bias(0, VOCAB, seed=0, max_new_tokens=3))})
    assert len(res["again"]["tokens"]) == 3
    gc.collect()
    assert set(sampler._ON_DEVICE) - before == set()

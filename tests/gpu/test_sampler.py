"""Sampling filters, penalties, the seeded noise, and parameter validation."""

from __future__ import annotations

import pytest
import torch

from rt.errors import InvalidRequestError
from rt.gpu.sampler import SampleRow, _filter, sample, seeded_uniform
from rt.gpu.sampling_params import SamplingParams


def row(params: SamplingParams, seed: int = 0, position: int = 0, **kw: object) -> SampleRow:
    base: dict[str, object] = dict(input_ids=[], output_ids=[], suppress_ids=[])
    base.update(kw)
    return SampleRow(params, seed, position, **base)  # type: ignore[arg-type]


def test_seeded_uniform_is_pure_and_uniform() -> None:
    seeds, positions = torch.tensor([1, 1, 2]), torch.tensor([5, 5, 5])
    u = seeded_uniform(seeds, positions, 50_000)
    assert torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert torch.equal(u[:1], seeded_uniform(seeds[:1], positions[:1], 50_000))
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01
    big = seeded_uniform(torch.tensor([(1 << 62) + 3]), torch.tensor([10**6]), 8)
    assert big.shape == (1, 8)


def test_filters_keep_the_right_tokens() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]] * 3)
    params = [SamplingParams(top_k=2), SamplingParams(top_p=0.8), SamplingParams(min_p=0.2)]
    kept = torch.isfinite(_filter(logits, params, 5))
    probs = torch.softmax(logits[0], -1)
    assert kept[0].tolist() == [True, True, False, False, False]
    n_top_p = int((torch.cumsum(probs, 0) - probs < 0.8).sum())
    assert kept[1].sum() == n_top_p
    assert kept[2].tolist() == (probs >= 0.2 * probs.max()).tolist()


def test_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]])).repeat(3000, 1)
    rows = [row(SamplingParams(temperature=1.0), seed=s, position=3) for s in range(3000)]
    counts = (
        torch.bincount(torch.tensor(sample(logits, rows).token_ids), minlength=3).float() / 3000
    )
    assert torch.allclose(counts, torch.tensor([0.6, 0.3, 0.1]), atol=0.03)


def test_greedy_penalties_bias_and_min_tokens() -> None:
    logits = torch.tensor([[3.0, 2.9, 1.0, -1.0]])
    assert sample(logits, [row(SamplingParams(temperature=0))]).token_ids == [0]
    rep = SamplingParams(temperature=0, repetition_penalty=2.0)
    assert sample(logits, [row(rep, input_ids=[0])]).token_ids == [1]
    freq = SamplingParams(temperature=0, frequency_penalty=0.2)
    assert sample(logits, [row(freq, output_ids=[0])]).token_ids == [1]
    pres = SamplingParams(temperature=0, presence_penalty=0.2)
    assert sample(logits, [row(pres, output_ids=[0, 0])]).token_ids == [1]
    bias = SamplingParams(temperature=0, logit_bias={3: 10.0})
    assert sample(logits, [row(bias)]).token_ids == [3]
    assert sample(logits, [row(SamplingParams(temperature=0), suppress_ids=[0, 1])]).token_ids == [
        2
    ]


def test_logprobs_are_of_the_raw_distribution() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    res = sample(logits, [row(SamplingParams(temperature=0.0, logprobs=True, top_logprobs=2))])
    ref = torch.log_softmax(logits, -1)[0]
    assert res.logprobs == pytest.approx([float(ref[1])])
    assert res.top_ids == [[1, 0]]
    assert res.top_logprobs == [pytest.approx([float(ref[1]), float(ref[0])])]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperature=-1.0), "temperature: expected a number in \\[0.0, None\\], got -1.0"),
        (dict(top_p=0.0), "top_p"),
        (dict(max_new_tokens=0), "max_new_tokens: expected an integer in \\[1"),
        (dict(min_new_tokens=5, max_new_tokens=2), "min_new_tokens"),
        (dict(n=0), "n: expected"),
        (
            dict(stop_token_ids=(999,)),
            "stop_token_ids: expected token ids in \\[0, 100\\), got 999",
        ),
        (dict(logit_bias={5: 1000.0}), "logit_bias\\[5\\]"),
        (dict(top_logprobs=-1), "top_logprobs"),
        (dict(seed=-3), "seed"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty: expected a finite number"),
        (dict(max_new_tokens="10"), "max_new_tokens: expected an integer, got '10'"),
    ],
)
def test_validation_says_what_was_expected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**kwargs).validate(vocab_size=100)  # type: ignore[arg-type]

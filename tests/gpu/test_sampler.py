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


def test_seeded_uniform_hashes_in_place_but_never_its_inputs() -> None:
    # the hash overwrites its [batch, vocab] tensors as it goes (allocation was half
    # the draw's time at batch 64); the caller's seeds and positions stay as they were
    seeds, positions = torch.tensor([5, (1 << 40) + 7]), torch.tensor([3, 9])
    kept = seeds.clone(), positions.clone()
    first = seeded_uniform(seeds, positions, 64)
    assert torch.equal(seeds, kept[0]) and torch.equal(positions, kept[1])
    assert torch.equal(first, seeded_uniform(seeds, positions, 64))
    # and a draw does not change the next one's noise (the token ids' part is kept)
    assert torch.equal(first[1:], seeded_uniform(seeds[1:], positions[1:], 64))


def test_seeded_uniform_draws_the_same_noise_as_every_earlier_release() -> None:
    # a seeded request's tokens are a pure function of (seed, position, logits) across
    # releases too, and the Triton kernel's draw (kernels/sampling.py) is checked against
    # this one: pinned values, (k + 0.5) / 2**23, that a change to the hash must not move
    seeds, positions = torch.tensor([0, 12345, (1 << 62) + 3]), torch.tensor([0, 7, 10**6])
    k = [
        [3219122, 6922862, 6162639, 6292973, 3175161],
        [2317493, 7629689, 4342190, 24798, 5819104],
        [4260733, 7423872, 6420657, 4365137, 234902],
    ]
    expected = (torch.tensor(k, dtype=torch.float64) + 0.5) / (1 << 23)
    assert torch.equal(seeded_uniform(seeds, positions, 5).double(), expected)


# One distribution, its ids shuffled so that the filters' sort and scatter matter:
#   id:    0     1     2     3     4
#   p:   0.08  0.45  0.02  0.30  0.15
# By probability, descending: id 1 (0.45), 3 (0.30), 4 (0.15), 0 (0.08), 2 (0.02);
# the mass ranked before each: 0, 0.45, 0.75, 0.90, 0.98.
PROBS = [0.08, 0.45, 0.02, 0.30, 0.15]
LOGITS = torch.log(torch.tensor([PROBS]))  # softmax(log p) = p


def kept(params: SamplingParams) -> set[int]:
    out = _filter(LOGITS, [params], len(PROBS))
    return {i for i, finite in enumerate(torch.isfinite(out[0]).tolist()) if finite}


@pytest.mark.parametrize(
    ("params", "survivors"),
    [
        (SamplingParams(), {0, 1, 2, 3, 4}),  # no filter
        (SamplingParams(top_k=1), {1}),
        (SamplingParams(top_k=2), {1, 3}),
        (SamplingParams(top_k=5), {0, 1, 2, 3, 4}),  # k = vocab: no filter
        # top-p keeps a token while the mass ranked before it is below p
        (SamplingParams(top_p=0.4), {1}),  # before id 3: 0.45 >= 0.4
        (SamplingParams(top_p=0.7), {1, 3}),  # before id 4: 0.75 >= 0.7
        (SamplingParams(top_p=0.8), {1, 3, 4}),  # before id 0: 0.90 >= 0.8
        (SamplingParams(top_p=0.95), {0, 1, 3, 4}),  # before id 2: 0.98 >= 0.95
        # a top_p that float32 rounds to 0 still keeps the top token (it kept none)
        (SamplingParams(top_p=1e-300), {1}),
        (SamplingParams(top_p=5e-324), {1}),
        (SamplingParams(top_k=2, top_p=1e-46), {1}),
        # min-p keeps p >= min_p * max p (max p = 0.45)
        (SamplingParams(min_p=0.05), {0, 1, 3, 4}),  # threshold 0.0225: drops 0.02
        (SamplingParams(min_p=0.2), {1, 3, 4}),  # threshold 0.09: drops 0.08, 0.02
        (SamplingParams(min_p=0.5), {1, 3}),  # threshold 0.225: drops 0.15 too
        # filters compose like successive warpers (HF, vLLM): top-p sees the top-k
        # renormalised: 0.45, 0.30, 0.15 over 0.90 = 0.5, 0.333, 0.167, so the mass
        # before id 4 is 0.833 >= 0.8 (on the raw distribution it would be 0.75: kept)
        (SamplingParams(top_k=3, top_p=0.8), {1, 3}),
    ],
)
def test_filters_keep_the_hand_computed_tokens(params: SamplingParams, survivors: set[int]) -> None:
    assert kept(params) == survivors


def test_filters_apply_per_row() -> None:
    params = [SamplingParams(top_k=1), SamplingParams(), SamplingParams(min_p=0.2)]
    out = _filter(LOGITS.repeat(3, 1), params, len(PROBS))
    assert torch.isfinite(out).tolist() == [
        [False, True, False, False, False],
        [True, True, True, True, True],
        [False, True, False, True, True],
    ]


def test_filters_apply_after_temperature() -> None:
    """At temperature 2 the distribution is p^(1/2) renormalised:
    ids 1, 3, 4, 0, 2 -> 0.3304, 0.2698, 0.1908, 0.1393, 0.0697; mass before each
    0, 0.3304, 0.6002, 0.7910, 0.9303. So top_p=0.7 keeps ids 1, 3, 4 (at temperature 1
    it keeps 1 and 3), sampled as 0.3304, 0.2698, 0.1908 over 0.7910 = 0.4177, 0.3411, 0.2412."""
    params = SamplingParams(temperature=2.0, top_p=0.7)
    logits = LOGITS.repeat(4000, 1)
    rows = [row(params, seed=s, position=7) for s in range(4000)]
    counts = torch.bincount(torch.tensor(sample(logits, rows).token_ids), minlength=5) / 4000
    assert counts[0] == 0 and counts[2] == 0
    assert counts[[1, 3, 4]].tolist() == pytest.approx([0.4177, 0.3411, 0.2412], abs=0.03)


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
    assert sample(logits, [row(rep, input_ids=[0])]).token_ids == [1]  # 3.0 / 2 = 1.5 < 2.9
    # a negative logit is multiplied, not divided: -1.0 * 2 = -2.0 < -1.5
    assert sample(torch.tensor([[-1.0, -1.5]]), [row(rep, output_ids=[0])]).token_ids == [1]
    freq = SamplingParams(temperature=0, frequency_penalty=0.2)
    assert sample(logits, [row(freq, output_ids=[0])]).token_ids == [1]  # 2.8 < 2.9
    pres = SamplingParams(temperature=0, presence_penalty=0.2)
    assert sample(logits, [row(pres, output_ids=[0, 0])]).token_ids == [1]  # 2.8 < 2.9
    # frequency scales with the count, presence does not: against 2.7,
    # 3.0 - 0.2 = 2.8 wins, 3.0 - 2 * 0.2 = 2.6 loses; presence twice is still 2.8
    close = torch.tensor([[3.0, 2.7]])
    assert sample(close, [row(freq, output_ids=[0])]).token_ids == [0]
    assert sample(close, [row(freq, output_ids=[0, 0])]).token_ids == [1]
    assert sample(close, [row(pres, output_ids=[0, 0])]).token_ids == [0]
    bias = SamplingParams(temperature=0, logit_bias={3: 10.0})
    assert sample(logits, [row(bias)]).token_ids == [3]
    assert sample(logits, [row(SamplingParams(temperature=0), suppress_ids=[0, 1])]).token_ids == [
        2
    ]


def test_allowed_token_ids_are_all_a_row_may_draw() -> None:
    """vLLM's allowed_token_ids, per row: sampled, with a filter, greedy, against a
    bias toward an id left out; the logprobs stay the model's, and a row without
    the field draws what it draws alone (the same seeded noise)."""
    vocab = 50
    logits = (torch.randn(1, vocab, generator=torch.Generator().manual_seed(5)) * 3).repeat(40, 1)
    allowed, best = (12, 7, 30), 7
    logits[:, [1, 12, 7, 30]] = torch.tensor([9.0, -5.0, -4.0, -4.5])  # (1: the model's best)
    only = dict(allowed_token_ids=allowed, logprobs=True)
    rows = [row(SamplingParams(temperature=1.5, **only), seed=s) for s in range(32)]
    rows += [row(SamplingParams(temperature=1.0, top_k=1, **only), seed=3)]
    rows += [row(SamplingParams(temperature=0, **only))]
    rows += [row(SamplingParams(temperature=0, logit_bias={1: 100.0}, **only))]
    free = row(SamplingParams(temperature=1.0), seed=9)
    res = sample(logits[: len(rows) + 1], [*rows, free])
    assert set(res.token_ids[:32]) == set(allowed)  # each drawn, and only they
    assert res.token_ids[32:35] == [best, best, best]
    assert res.token_ids[35] == sample(logits[:1], [free]).token_ids[0]
    raw = torch.log_softmax(logits[0], dim=-1)
    assert res.logprobs is not None
    assert res.logprobs[33] == pytest.approx(float(raw[best]), abs=1e-5)


def test_logprobs_are_of_the_raw_distribution() -> None:
    # log-sum-exp of (1, 2, 0.5) = log(2.71828 + 7.38906 + 1.64872) = 2.46437
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    res = sample(logits, [row(SamplingParams(temperature=0.0, logprobs=True, top_logprobs=2))])
    assert res.logprobs == pytest.approx([2.0 - 2.46437], abs=1e-5)
    assert res.top_ids == [[1, 0]]
    assert res.top_logprobs == [pytest.approx([2.0 - 2.46437, 1.0 - 2.46437], abs=1e-5)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperature=-1.0), "temperature: expected a number >= 0, got -1.0"),
        # logits / penalty overflowed float32 under 1e-6: token 0 every step
        (dict(repetition_penalty=1e-320), "repetition_penalty: expected a number >= 1e-06"),
        (dict(repetition_penalty=1e-7), "repetition_penalty: expected a number >= 1e-06"),
        (dict(top_p=0.0), "top_p"),
        (dict(max_new_tokens=0), "max_new_tokens: expected an integer in \\[1"),
        (dict(min_new_tokens=5, max_new_tokens=2), "min_new_tokens"),
        (dict(n=0), "n: expected"),
        (
            dict(stop_token_ids=(999,)),
            "stop_token_ids: expected token ids in \\[0, 100\\), got 999",
        ),
        (dict(logit_bias={5: 1000.0}), "logit_bias\\[5\\]"),
        (dict(allowed_token_ids=()), "allowed_token_ids: expected at least one token id, got an"),
        (dict(allowed_token_ids=(3, 100)), "allowed_token_ids: expected token ids in \\[0, 100\\)"),
        (dict(allowed_token_ids=5), "allowed_token_ids: expected a list of token ids, got 5"),
        (dict(top_logprobs=-1), "top_logprobs"),
        (dict(seed=-3), "seed"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty: expected a finite number"),
        (dict(max_new_tokens="10"), "max_new_tokens: expected an integer, got '10'"),
    ],
)
def test_validation_says_what_was_expected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**kwargs).validate(vocab_size=100)  # type: ignore[arg-type]


def test_a_vanishing_temperature_is_greedy_and_ints_are_numbers() -> None:
    """Dividing by 5e-324 (0 in float32) used to give inf logits and a wrong token;
    an all-int batch of parameters used to build integer tensors."""
    logits = torch.tensor([[0.5, 0.1, 4.0, 3.9]]).repeat(8, 1)
    tiny = [row(SamplingParams(temperature=5e-324), seed=s) for s in range(4)]
    ints = [row(SamplingParams(temperature=1, top_p=1, min_p=0), seed=s) for s in range(4)]
    out = sample(logits, tiny + ints).token_ids
    assert out[:4] == [2, 2, 2, 2]
    assert set(out[4:]) <= {0, 1, 2, 3}

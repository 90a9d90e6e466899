"""kernels.sampling against the engine sampler's torch path, token for token.

Exact equality needs the float rounding of the kernel (its own sums and
exponentials) and of torch (softmax, cumsum, log) to agree on every decision.
They do except within rounding of a threshold, so the data is checked to keep
clear of those corners (``_kept_counts``) before tokens are compared.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels import device_type
from kernels.sampling import sample_ref, sample_tokens, seeded_uniform_triton
from rt.gpu.sampler import SampleRow, sample, seeded_uniform
from rt.gpu.sampling_params import SEED_MASK, SamplingParams

DEVICE = torch.device(device_type())
NEG_INF = float("-inf")
# the hash's top value here (h >> 9 == 2**23 - 1): the largest uniform, 1 - 2**-24
U_ONE_SEED, U_ONE_POSITION, U_ONE_TOKEN = SEED_MASK, 53436, 62

# (temperature, top_k, top_p, min_p); temperature 0 = greedy
ROWS = [
    (0.0, 0, 1.0, 0.0),
    (1.0, 0, 1.0, 0.0),
    (0.7, 1, 1.0, 0.0),
    (1.3, 5, 1.0, 0.0),
    (1.0, 50, 1.0, 0.0),
    (1.0, 0, 0.5, 0.0),
    (0.8, 0, 0.9, 0.0),
    (1.0, 0, 1.0, 0.05),
    (1.5, 0, 1.0, 0.2),
    (1.0, 50, 0.9, 0.0),
    (1.2, 5, 0.5, 0.05),
    (0.9, 0, 0.9, 0.05),
    (2.0, 50, 0.9, 0.2),
    (0.0, 5, 0.5, 0.2),  # greedy: the filters are ignored
    (1.0, 1 << 20, 1.0, 0.0),  # top_k past the vocabulary: off
    (1.0, -1, 0.9, 0.0),  # top_k < 0: off
]
BOUNDARY_ROWS = [(1.0, 5, 1.0, 0.0), (1.0, 0, 0.5, 0.0), (0.5, 0, 1.0, 0.2), (1.0, 50, 0.9, 0.05)]
SEEDS = [0, SEED_MASK, 1, (1 << 32) - 1, 1 << 32, 0x123456789ABCDEF, 7, 1 << 62]
POSITIONS = [0, 1, 17, 4095, (1 << 32) + 7, 123_456_789, 3, 1 << 40]


def _batch(
    vocab: int, rows: list[tuple[float, int, float, float]], gen_seed: int, scale: float = 3.0
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(gen_seed)
    n_rows = len(rows)
    logits = torch.randn(n_rows, vocab, generator=gen) * scale
    # suppressed ids in every third row, including each such row's best logit
    for i in range(0, n_rows, 3):
        ids = torch.randperm(vocab, generator=gen)[: vocab // 10]
        logits[i, ids] = NEG_INF
        logits[i, logits[i].argmax()] = NEG_INF
    return (
        logits,
        torch.tensor([r[0] for r in rows], dtype=torch.float32),
        torch.tensor([r[1] for r in rows], dtype=torch.int64),
        torch.tensor([r[2] for r in rows], dtype=torch.float32),
        torch.tensor([r[3] for r in rows], dtype=torch.float32),
        torch.tensor([SEEDS[i % len(SEEDS)] for i in range(n_rows)], dtype=torch.int64),
        torch.tensor([POSITIONS[(3 * i) % len(POSITIONS)] for i in range(n_rows)]),
    )


def _kept_counts(*batch: torch.Tensor) -> list[int]:
    """How many tokens each row keeps, a prefix of its descending order (float64 model
    of min-p, then top-k, then top-p; vocab for greedy rows), after asserting that every
    min-p ratio and top-p prefix mass is clear of its threshold and each sampled row's
    winner leads the runner-up by more than log/exp rounding."""
    logits, temps, top_k, top_p, min_p, seeds, positions = batch
    vocab = logits.shape[1]
    noise = -torch.log(-torch.log(seeded_uniform(seeds, positions, vocab))).double()
    counts = []
    for i in range(logits.shape[0]):
        if temps[i] == 0:
            counts.append(vocab)
            continue
        scaled = (logits[i] / temps[i]).double().sort(descending=True)
        rel = scaled.values - scaled.values[0]  # log of the probability relative to the max
        n_kept = int((rel > NEG_INF).sum())
        if min_p[i] > 0:
            gap = (rel[:n_kept] - math.log(min_p[i])).abs().min()
            assert gap > 1e-4, f"row {i}: a token within {gap:.1e} of min-p"
            n_kept = int((rel >= math.log(min_p[i])).sum())
        if 0 < top_k[i] < vocab:
            n_kept = min(n_kept, int(top_k[i]))
        if top_p[i] < 1:
            probs = torch.softmax(rel[:n_kept], dim=0)
            before = probs.cumsum(0) - probs
            gap = (before - top_p[i].double()).abs().min()
            assert gap > 1e-5, f"row {i}: a prefix mass within {gap:.1e} of top-p"
            n_kept = int((before < top_p[i].double()).sum())
        kept = scaled.indices[:n_kept]
        scores = (scaled.values[:n_kept] + noise[i, kept]).sort(descending=True).values
        if n_kept > 1:
            assert scores[0] - scores[1] > 1e-4, f"row {i}: Gumbel winner leads by too little"
        counts.append(n_kept)
    return counts


@pytest.mark.parametrize(
    ("vocab", "rows", "scale", "block_v", "gen_seed"),
    [
        (1000, ROWS, 3.0, None, 0),
        (257, ROWS[9:15], 3.0, 128, 2),
    ],
)
def test_sample_tokens_match_reference(
    vocab: int,
    rows: list[tuple[float, int, float, float]],
    scale: float,
    block_v: int | None,
    gen_seed: int,
) -> None:
    batch = _batch(vocab, rows, gen_seed, scale)
    _kept_counts(*batch)
    expected = sample_ref(*batch)
    tokens = sample_tokens(*(t.to(DEVICE) for t in batch), block_v=block_v).cpu()
    assert tokens.dtype == torch.int64
    assert tokens.tolist() == expected.tolist()
    logits = batch[0]
    assert bool((logits.gather(1, tokens[:, None]) > NEG_INF).all()), "a suppressed id won"


def test_filter_boundaries() -> None:
    """Each filter's edge, token-sharp: the token with the largest noise is moved (values
    swapped, so the thresholds stay) to the last kept rank, where it wins, or to the first
    dropped rank, where it must not."""
    vocab = 1000
    batch = _batch(vocab, [r for r in BOUNDARY_ROWS for _ in range(2)], 6, scale=1.0)
    logits, _, _, _, _, seeds, positions = batch
    noise = -torch.log(-torch.log(seeded_uniform(seeds, positions, vocab)))
    favourites = torch.where(logits > NEG_INF, noise, NEG_INF).argmax(dim=1).tolist()
    for i, (n_kept, favourite) in enumerate(zip(_kept_counts(*batch), favourites, strict=True)):
        order = logits[i].argsort(descending=True)
        target = int(order[n_kept - 1 if i % 2 == 0 else n_kept])
        logits[i, [favourite, target]] = logits[i, [target, favourite]]
    _kept_counts(*batch)
    expected = sample_ref(*batch).tolist()
    for i, favourite in enumerate(favourites):
        assert (expected[i] == favourite) == (i % 2 == 0), f"row {i}: data not sharp"
    tokens = sample_tokens(*(t.to(DEVICE) for t in batch), block_v=256).cpu()
    assert tokens.tolist() == expected


def test_matches_engine_sampler() -> None:
    vocab = 1000
    gen = torch.Generator().manual_seed(3)
    raw = torch.randn(5, vocab, generator=gen) * 3
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, top_k=50, top_p=0.9),
        SamplingParams(temperature=1.1, min_p=0.05, logit_bias={7: 6.0, 9: -3.0}),
        SamplingParams(temperature=1.0, top_p=0.5, min_p=0.2),
        SamplingParams(temperature=1.0, top_k=5),
    ]
    suppress = [[], [3, 11], [], [int(raw[3].argmax())], [500]]
    rows = [
        SampleRow(p, seed=s, position=q, input_ids=[], output_ids=[], suppress_ids=ids)
        for p, s, q, ids in zip(params, SEEDS[:5], POSITIONS[3:8], suppress, strict=True)
    ]
    expected = sample(raw, rows).token_ids

    logits = raw.clone()  # what sample() has after bias and suppression
    for i, (p, ids) in enumerate(zip(params, suppress, strict=True)):
        for tok, bias in p.logit_bias.items():
            logits[i, tok] += bias
        logits[i, ids] = NEG_INF
    batch = (
        logits,
        torch.tensor([0.0 if p.greedy else p.temperature for p in params]),
        torch.tensor([p.top_k for p in params]),
        torch.tensor([p.top_p for p in params]),
        torch.tensor([p.min_p for p in params]),
        torch.tensor([r.seed for r in rows]),
        torch.tensor([r.position for r in rows]),
    )
    _kept_counts(*batch)
    tokens = sample_tokens(*(t.to(DEVICE) for t in batch)).cpu()
    assert tokens.tolist() == expected


@pytest.mark.parametrize(("vocab", "block_v"), [(1000, None), (257, 128)])
def test_uniform_matches_seeded_uniform(vocab: int, block_v: int | None) -> None:
    seeds = torch.tensor([*SEEDS, U_ONE_SEED], dtype=torch.int64)
    positions = torch.tensor([*POSITIONS, U_ONE_POSITION], dtype=torch.int64)
    expected = seeded_uniform(seeds, positions, vocab)
    got = seeded_uniform_triton(seeds.to(DEVICE), positions.to(DEVICE), vocab, block_v)
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    assert expected[-1, U_ONE_TOKEN] == 1.0 - 2.0**-24
    assert float(expected.max()) < 1.0


def test_the_largest_uniform_never_picks_a_dropped_token() -> None:
    """The largest uniform gives finite noise: a dropped token (suppressed, or out of
    top-k) loses in the kernel and in the reference; kept, it wins in both."""
    vocab = 1000
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(4))
    logits[:, U_ONE_TOKEN] = -20.0
    logits[0, U_ONE_TOKEN] = 0.0  # an ordinary logit: its noise ≈ 16.6 is what wins
    logits[1, U_ONE_TOKEN] = NEG_INF
    batch = (
        logits,
        torch.ones(3),
        torch.tensor([0, 0, 5]),
        torch.ones(3),
        torch.zeros(3),
        torch.full((3,), U_ONE_SEED),
        torch.full((3,), U_ONE_POSITION),
    )
    tokens = sample_tokens(*(t.to(DEVICE) for t in batch)).cpu().tolist()
    assert tokens == sample_ref(*batch).tolist()
    assert tokens[0] == U_ONE_TOKEN
    assert tokens[1] != U_ONE_TOKEN
    assert tokens[2] != U_ONE_TOKEN
    assert tokens[2] in logits[2].topk(5).indices.tolist()


def test_a_top_p_that_float32_rounds_to_0_keeps_the_top_token() -> None:
    """A top_p above 0 that float32 holds as 0 (1e-300, 5e-324, 1e-46) made the
    mass to reach 0: the floor was the largest key, no token was kept, and every
    row drew id 0; the top-ranked token stays, as in the engine sampler."""
    probs = torch.tensor([0.08, 0.45, 0.02, 0.30, 0.15])
    batch = (
        torch.log(probs).repeat(3, 1),
        torch.ones(3),
        torch.zeros(3, dtype=torch.int64),
        torch.tensor([1e-300, 5e-324, 1e-46], dtype=torch.float32),  # 0.0 each
        torch.zeros(3),
        torch.tensor([1, 2, 3]),
        torch.zeros(3, dtype=torch.int64),
    )
    tokens = sample_tokens(*(t.to(DEVICE) for t in batch)).cpu().tolist()
    assert tokens == sample_ref(*batch).tolist() == [1, 1, 1]


def test_tokens_tied_with_the_last_kept_are_kept_too() -> None:
    """The floor is a key, not a rank (the module's docstring): with two tokens tied
    at the top and a top_p the first alone covers, both are drawn, where the sort's
    reference keeps one of them."""
    rows = 32
    probs = torch.tensor([0.05, 0.40, 0.10, 0.40, 0.05])
    batch = (
        torch.log(probs).repeat(rows, 1),
        torch.ones(rows),
        torch.zeros(rows, dtype=torch.int64),
        torch.full((rows,), 0.1),
        torch.zeros(rows),
        torch.arange(rows),
        torch.zeros(rows, dtype=torch.int64),
    )
    tokens = sample_tokens(*(t.to(DEVICE) for t in batch)).cpu().tolist()
    assert set(tokens) == {1, 3}, tokens
    assert len(set(sample_ref(*batch).tolist())) == 1


def test_launcher_checks_dtypes_and_shapes() -> None:
    logits, *rest = (t.to(DEVICE) for t in _batch(64, ROWS[:2], 5))
    with pytest.raises(AssertionError, match="seeds"):
        sample_tokens(logits, *rest[:4], rest[4].int(), rest[5])
    with pytest.raises(AssertionError, match="top_p"):
        sample_tokens(logits, rest[0], rest[1], rest[2][:1], *rest[3:])
    with pytest.raises(AssertionError, match="unit stride"):
        sample_tokens(logits.t().contiguous().t(), *rest)

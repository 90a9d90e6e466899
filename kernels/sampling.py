"""Seeded sampling without a sort: temperature, min-p, top-k, top-p, Gumbel-max.

The same tokens as ``rt.gpu.sampler`` (its temperature, ``_filter`` and
Gumbel-max path). One program per row streams the vocabulary in ``BLOCK_V``
tiles, a handful of times:

* min-p keeps a token when its probability relative to the max,
  ``exp(scaled - max)``, is at least ``min_p``;
* top-k and top-p each become a floor on an order-preserving uint32 key of the
  scaled logit, found by a radix select (``RADIX_BITS`` per pass, 8 passes):
  the largest key ``t`` with ``count(key >= t) >= k`` (the k-th largest value),
  then the largest ``t`` with ``mass(key >= t) >= top_p`` (the last token the
  sorted reference keeps: a token stays while the mass ranked before it is
  below ``top_p``);
* the noise is the engine's counter hash of (seed, position, token id), so a
  row's token does not depend on the rest of the batch.

Exact: the uniforms, the division by temperature, greedy rows, top-k (logits
without ties, see below). Within rounding: min-p and top-p compare exponentials and sums
that round differently from torch's softmax and cumsum, and the Gumbel scores
use this backend's log, so a token within rounding of a threshold, or two
scores within rounding of each other, may go the other way. Ties: a token whose
logit equals that of the last token top-k or top-p keeps is kept as well (the
floor is a key, not a rank), where the reference's sort keeps only those it
happens to rank first; so the kernel may draw from a few more tokens there.

The uniforms stay below 1 (23 bits of the hash), so the noise is always
finite and a dropped (-inf) token never wins, here or in the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rt.gpu.sampler import _filter, seeded_uniform
from rt.gpu.sampling_params import SamplingParams

__all__ = ["sample_ref", "sample_tokens", "seeded_uniform_triton"]


def sample_ref(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """The engine sampler's temperature + ``_filter`` + Gumbel-max path, in torch.

    logits: [bs, vocab] float32, already biased, penalised and suppressed (-inf).
    temperatures 0 marks a greedy row (plain argmax). Returns [bs] int64.
    """
    vocab = logits.shape[1]
    params = [
        SamplingParams(temperature=float(t), top_k=int(k), top_p=float(p), min_p=float(q))
        for t, k, p, q in zip(
            temperatures.tolist(), top_k.tolist(), top_p.tolist(), min_p.tolist(), strict=True
        )
    ]
    greedy = temperatures == 0
    temps = torch.where(greedy, 1.0, temperatures)
    scaled = _filter(logits / temps[:, None], params, vocab)
    u = seeded_uniform(seeds, positions, vocab)
    sampled = (scaled - torch.log(-torch.log(u))).argmax(dim=-1)
    return torch.where(greedy, logits.argmax(dim=-1), sampled)


@triton.jit
def _mix32(x):
    # rt.gpu.sampler._mix32_ on uint32: products wrap mod 2**32, its `& 0xFFFFFFFF`
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x1B873593
    return x ^ (x >> 16)


@triton.jit
def _row_hash(seed, position):
    """seed, position: int64 scalars (seed in [0, 2**63)) → uint32 row hash."""
    seed_bits = seed.to(tl.uint64, bitcast=True)
    high = (seed_bits >> 32).to(tl.uint32)
    low = (seed_bits & 0xFFFFFFFF).to(tl.uint32)
    pos = (position.to(tl.uint64, bitcast=True) & 0xFFFFFFFF).to(tl.uint32)
    return _mix32(_mix32(_mix32(pos) ^ high) ^ low)


@triton.jit
def _uniform(row_hash, tokens):
    """rt.gpu.sampler.seeded_uniform for int32 token ids: float32 in (0, 1)."""
    h = _mix32(_mix32(row_hash ^ (tokens.to(tl.uint32) * 0x9E3779B1)) ^ 0x2545F491)
    return ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)


@triton.jit
def _order_key(x):
    """float32 → uint32 with the same order (-inf < finite < inf; no NaN)."""
    bits = x.to(tl.uint32, bitcast=True)
    negative = (bits >> 31) == 1
    return bits ^ tl.where(negative, tl.full(x.shape, 0xFFFFFFFF, tl.uint32), 0x80000000)


@triton.jit
def _scaled_tile(row_ptr, start, vocab, temperature, BLOCK_V: tl.constexpr):
    """One tile of a row: token ids and logits / temperature (-inf past the vocabulary)."""
    tokens = start + tl.arange(0, BLOCK_V)
    x = tl.load(row_ptr + tokens, mask=tokens < vocab, other=float("-inf"))
    return tokens, tl.math.div_rn(x, temperature)  # IEEE division, as torch's logits / temps


@triton.jit
def _tile(row_ptr, start, vocab, temperature, row_max, min_p, floor, BLOCK_V: tl.constexpr):
    """One tile of a row: token ids, scaled logits, their order keys, exp(scaled - max)
    and the kept mask (in the vocabulary, finite, min-p survivor, key >= floor)."""
    tokens, scaled = _scaled_tile(row_ptr, start, vocab, temperature, BLOCK_V)
    key = _order_key(scaled)
    weight = tl.exp(scaled - row_max)  # probability relative to the max probability
    kept = (tokens < vocab) & (scaled > float("-inf")) & (weight >= min_p) & (key >= floor)
    return tokens, scaled, key, weight, kept


@triton.jit
def _radix_floor(
    row_ptr,
    vocab,
    temperature,
    row_max,
    min_p,
    floor,
    target,
    BY_MASS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    """The largest order key t such that the kept tokens (key >= floor) with key >= t
    number (BY_MASS false) or weigh (BY_MASS true) at least target; 0 when none does.

    A radix select from the top digit down: each step counts, in one pass, the tokens
    at or above every candidate digit and keeps the largest digit that reaches target.
    """
    digits = tl.arange(0, 1 << RADIX_BITS).to(tl.uint32)
    found = tl.zeros([], tl.uint32)
    for step in range(32 // RADIX_BITS):
        candidates = found | (digits << (32 - RADIX_BITS - RADIX_BITS * step))
        reached = tl.zeros([1 << RADIX_BITS], tl.float32)  # exact counts: vocab < 2**24
        for start in range(0, vocab, BLOCK_V):
            _, _, key, weight, kept = _tile(
                row_ptr, start, vocab, temperature, row_max, min_p, floor, BLOCK_V
            )
            above = kept[:, None] & (key[:, None] >= candidates[None, :])
            if BY_MASS:
                reached += tl.sum(tl.where(above, weight[:, None], 0.0), axis=0)
            else:
                reached += tl.sum(above.to(tl.float32), axis=0)
        # reached falls as the digit grows: the largest digit that still reaches target
        found = tl.max(tl.where(reached >= target, candidates, found), axis=0)
    return found


@triton.jit
def _sample_kernel(
    logits_ptr,
    stride_row,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    seed_ptr,
    position_ptr,
    out_ptr,
    vocab,
    BLOCK_V: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    temperature = tl.load(temperature_ptr + row)
    greedy = temperature == 0.0
    sampling = temperature != 0.0
    temperature = tl.where(greedy, 1.0, temperature)
    min_p = tl.where(greedy, 0.0, tl.load(min_p_ptr + row))
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)

    row_max = tl.full([], float("-inf"), tl.float32)
    for start in range(0, vocab, BLOCK_V):
        _, scaled = _scaled_tile(row_ptr, start, vocab, temperature, BLOCK_V)
        row_max = tl.maximum(row_max, tl.max(scaled, axis=0))

    # top-k over the min-p survivors: the key of the k-th largest
    k_floor = tl.zeros([], tl.uint32)
    if (top_k > 0) & (top_k < vocab) & sampling:
        k_floor = _radix_floor(
            row_ptr, vocab, temperature, row_max, min_p, k_floor, top_k.to(tl.float32),
            False, BLOCK_V, RADIX_BITS,
        )  # fmt: skip

    # top-p over the top-k survivors: the key of the last token the sorted reference
    # keeps (mass at or above it >= top_p, strictly above it < top_p)
    p_floor = tl.zeros([], tl.uint32)
    if (top_p < 1.0) & sampling:
        total = tl.zeros([], tl.float32)
        for start in range(0, vocab, BLOCK_V):
            _, _, _, weight, kept = _tile(
                row_ptr, start, vocab, temperature, row_max, min_p, k_floor, BLOCK_V
            )
            total += tl.sum(tl.where(kept, weight, 0.0), axis=0)
        # the mass to reach is above 0 (the top token's weight is 1): a top_p float32
        # holds as 0 made it 0, which the largest key reached, and no token was kept
        p_floor = _radix_floor(
            row_ptr, vocab, temperature, row_max, min_p, k_floor,
            tl.maximum(top_p * total, 1e-30), True, BLOCK_V, RADIX_BITS,
        )  # fmt: skip

    # Gumbel-max over the kept tokens; ties go to the lowest id, as torch.argmax
    row_hash = _row_hash(tl.load(seed_ptr + row), tl.load(position_ptr + row))
    floor = tl.maximum(k_floor, p_floor)
    best_score = tl.full([], float("-inf"), tl.float32)
    best_token = tl.zeros([], tl.int32)
    for start in range(0, vocab, BLOCK_V):
        tokens, scaled, _, _, kept = _tile(
            row_ptr, start, vocab, temperature, row_max, min_p, floor, BLOCK_V
        )
        minus_log_u = -tl.log(_uniform(row_hash, tokens))
        # u == 1.0: log(-log(u)) = -inf, the token scores +inf (log(0) itself is avoided)
        noise = tl.where(minus_log_u > 0.0, tl.log(tl.maximum(minus_log_u, 1e-30)), float("-inf"))
        noise = tl.where(greedy, 0.0, noise)
        score = tl.where(kept, tl.where(kept, scaled, 0.0) - noise, float("-inf"))
        tile_best = tl.max(score, axis=0)
        tile_token = start + tl.argmax(score, axis=0)
        best_token = tl.where(tile_best > best_score, tile_token, best_token)
        best_score = tl.maximum(best_score, tile_best)
    tl.store(out_ptr + row, best_token.to(tl.int64))


@triton.jit
def _uniform_kernel(seed_ptr, position_ptr, out_ptr, vocab, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    row_hash = _row_hash(tl.load(seed_ptr + row), tl.load(position_ptr + row))
    for start in range(0, vocab, BLOCK_V):
        tokens = start + tl.arange(0, BLOCK_V)
        u = _uniform(row_hash, tokens)
        tl.store(out_ptr + row.to(tl.int64) * vocab + tokens, u, mask=tokens < vocab)


def _check_rows(name: str, t: torch.Tensor, bs: int, dtypes: tuple[torch.dtype, ...]) -> None:
    assert t.shape == (bs,), f"{name}: expected shape ({bs},), got {tuple(t.shape)}"
    assert t.dtype in dtypes, f"{name}: expected dtype in {dtypes}, got {t.dtype}"
    assert t.is_contiguous(), f"{name}: expected a contiguous tensor"


def _block_v(vocab: int, block_v: int | None) -> int:
    block = block_v if block_v is not None else min(triton.next_power_of_2(vocab), 1024)
    assert block > 0 and block & (block - 1) == 0, f"block_v must be a power of two, got {block}"
    return block


def sample_tokens(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    block_v: int | None = None,
) -> torch.Tensor:
    """One token per row, [bs] int64: what ``sample_ref`` returns, without a sort.

    logits: [bs, vocab] float32, unit stride along the vocabulary, each row with
    at least one finite value (suppressed ids are -inf and never sampled).
    temperatures [bs] float32, 0 for a greedy row (argmax, filters ignored).
    top_k [bs] int32/int64 (off unless 0 < k < vocab); top_p [bs] float32 (1 =
    off); min_p [bs] float32 (0 = off); seeds [bs] int64 in [0, 2**63);
    positions [bs] int64. block_v: tile width, a power of two.
    """
    assert logits.dim() == 2, f"logits: expected [bs, vocab], got {tuple(logits.shape)}"
    assert logits.dtype == torch.float32, f"logits: expected float32, got {logits.dtype}"
    assert logits.stride(1) == 1, "logits: expected unit stride along the vocabulary"
    bs, vocab = logits.shape
    assert vocab < 2**24, f"vocab {vocab}: counts are float32 sums, exact below 2**24"
    _check_rows("temperatures", temperatures, bs, (torch.float32,))
    _check_rows("top_k", top_k, bs, (torch.int32, torch.int64))
    _check_rows("top_p", top_p, bs, (torch.float32,))
    _check_rows("min_p", min_p, bs, (torch.float32,))
    _check_rows("seeds", seeds, bs, (torch.int64,))
    _check_rows("positions", positions, bs, (torch.int64,))
    for t in (temperatures, top_k, top_p, min_p, seeds, positions):
        assert t.device == logits.device, f"expected all tensors on {logits.device}"
    out = torch.empty(bs, dtype=torch.int64, device=logits.device)
    if bs:
        _sample_kernel[(bs,)](
            logits,
            logits.stride(0),
            temperatures,
            top_k,
            top_p,
            min_p,
            seeds,
            positions,
            out,
            vocab,
            BLOCK_V=_block_v(vocab, block_v),
            RADIX_BITS=4,
            num_warps=8,  # [BLOCK_V, 2**RADIX_BITS] tiles in the radix passes
        )
    return out


def seeded_uniform_triton(
    seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, block_v: int | None = None
) -> torch.Tensor:
    """The kernel's noise uniforms, [bs, vocab_size] float32: ``seeded_uniform`` in Triton."""
    bs = seeds.shape[0]
    _check_rows("seeds", seeds, bs, (torch.int64,))
    _check_rows("positions", positions, bs, (torch.int64,))
    assert positions.device == seeds.device, "seeds and positions: expected one device"
    out = torch.empty(bs, vocab_size, dtype=torch.float32, device=seeds.device)
    if bs:
        _uniform_kernel[(bs,)](
            seeds, positions, out, vocab_size, BLOCK_V=_block_v(vocab_size, block_v)
        )
    return out

"""Rotary position embedding applied in place to q and k (rotate_half layout).

Matches ``rt.gpu.models.rope``: ``freqs = positions.float() * inv_freq`` in
float32, cos and sin of it rounded to q's dtype, then
``x * cos + rotate_half(x) * sin`` with each product and the sum rounded to that
dtype, as torch computes it. Rope scaling is already folded into ``inv_freq``
(``rope_inv_freq``). One program rotates every head of BLOCK_T tokens, so cos
and sin are computed once per token: BLOCK_T is 1 natively (a program per token)
and 16 under the interpreter, where each program's ops are dispatched in Python.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from kernels import interpreted

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TILE = 2048  # elements of one [heads, half] tile: bounds registers per program
# tokens per program: 1 natively; the interpreter pays per program (and per op), not
# per element, so it takes [BLOCK_T, heads, half] tiles
INTERPRETED_BLOCK_T = 16


def apply_rotary_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference: new rotated ``(q, k)``, computed as ``rope.py`` does."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos[:, None, :] + rotated * sin[:, None, :]

    return rotate(q), rotate(k)


@triton.jit
def _round(x, dtype: tl.constexpr):
    # round a float32 value to ``dtype`` and back: where torch rounds in low precision
    return x.to(dtype).to(tl.float32)


@triton.jit
def _rotate_heads(
    x_ptr,  # [num_tokens, num_heads, head_dim], last dim contiguous
    tokens,  # [BLOCK_T] int64 token ids of this program
    token_mask,  # [BLOCK_T]: tokens < num_tokens
    stride_token,
    stride_head,
    num_heads,
    half,
    cos,  # [BLOCK_T, 1, BLOCK_HALF] float32, already rounded to x's dtype
    sin,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_HALF)[None, None, :]
    rows = x_ptr + tokens[:, None, None] * stride_token
    row_mask = token_mask[:, None, None] & (cols < half)
    dtype = x_ptr.dtype.element_ty
    for h0 in tl.range(0, num_heads, BLOCK_H):
        heads = (h0 + tl.arange(0, BLOCK_H))[None, :, None]
        mask = row_mask & (heads < num_heads)
        ptrs = rows + heads * stride_head + cols
        x1 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptrs + half, mask=mask, other=0.0).to(tl.float32)
        out1 = _round(x1 * cos, dtype) - _round(x2 * sin, dtype)
        out2 = _round(x2 * cos, dtype) + _round(x1 * sin, dtype)
        tl.store(ptrs, out1.to(dtype), mask=mask)
        tl.store(ptrs + half, out2.to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    positions_ptr,
    inv_freq_ptr,
    stride_q_token,
    stride_q_head,
    stride_k_token,
    stride_k_head,
    num_tokens,
    num_heads,
    num_kv_heads,
    half,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    PRECISE_TRIG: tl.constexpr,
):
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    token_mask = tokens < num_tokens
    cols = tl.arange(0, BLOCK_HALF)
    inv_freq = tl.load(inv_freq_ptr + cols, mask=cols < half, other=0.0)
    positions = tl.load(positions_ptr + tokens, mask=token_mask, other=0)
    freqs = positions.to(tl.float32)[:, None] * inv_freq[None, :]  # [BLOCK_T, BLOCK_HALF]
    if PRECISE_TRIG:
        # libdevice reduces large arguments (position * inv_freq reaches 1e5 rad)
        # fully, as torch does; the interpreter has no libdevice.
        cos = libdevice.cos(freqs)
        sin = libdevice.sin(freqs)
    else:
        cos = tl.cos(freqs)
        sin = tl.sin(freqs)
    dtype = q_ptr.dtype.element_ty
    cos = _round(cos, dtype)[:, None, :]  # [BLOCK_T, 1, BLOCK_HALF]: broadcast over heads
    sin = _round(sin, dtype)[:, None, :]
    _rotate_heads(
        q_ptr, tokens, token_mask, stride_q_token, stride_q_head, num_heads, half, cos, sin,
        BLOCK_H, BLOCK_HALF,
    )  # fmt: skip
    _rotate_heads(
        k_ptr, tokens, token_mask, stride_k_token, stride_k_head, num_kv_heads, half, cos, sin,
        BLOCK_H, BLOCK_HALF,
    )  # fmt: skip


def apply_rotary_(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
) -> None:
    """Rotate ``q`` and ``k`` IN PLACE by the angles ``positions * inv_freq``.

    ``q``: ``[num_tokens, num_heads, head_dim]``, ``k``: ``[num_tokens, num_kv_heads,
    head_dim]``, same dtype, any strides with the last one 1 (views of a fused qkv
    output are written through); ``positions``: ``[num_tokens]`` int64;
    ``inv_freq``: ``[head_dim // 2]`` float32.
    """
    assert q.dtype in DTYPES, f"q.dtype={q.dtype}; expected one of {DTYPES}"
    assert k.dtype == q.dtype, f"k.dtype={k.dtype} differs from q.dtype={q.dtype}"
    assert q.dim() == 3 and k.dim() == 3, (
        f"q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}; expected [tokens, heads, head_dim]"
    )
    num_tokens, num_heads, head_dim = q.shape
    assert k.shape[0] == num_tokens and k.shape[2] == head_dim, (
        f"k.shape={tuple(k.shape)}; expected [{num_tokens}, num_kv_heads, {head_dim}]"
    )
    assert head_dim % 2 == 0, f"head_dim={head_dim}; expected even"
    assert q.stride(-1) == 1 and k.stride(-1) == 1, (
        f"q.stride()={q.stride()}, k.stride()={k.stride()}; the last dim must be contiguous"
    )
    assert positions.shape == (num_tokens,) and positions.dtype == torch.int64, (
        f"positions: {tuple(positions.shape)} {positions.dtype}; expected ({num_tokens},) int64"
    )
    assert positions.stride(0) == 1 or num_tokens <= 1, "positions must be contiguous"
    half = head_dim // 2
    assert inv_freq.shape == (half,) and inv_freq.dtype == torch.float32, (
        f"inv_freq: {tuple(inv_freq.shape)} {inv_freq.dtype}; expected ({half},) float32"
    )
    assert inv_freq.stride(0) == 1 or half <= 1, "inv_freq must be contiguous"
    if num_tokens == 0:
        return
    block_t = INTERPRETED_BLOCK_T if interpreted() else 1
    block_half = triton.next_power_of_2(half)
    # TILE bounds one token's [heads, half] tile; natively BLOCK_T is 1, so it bounds the
    # program's tile (the interpreter's tiles are numpy arrays: larger is cheaper there)
    block_h = min(triton.next_power_of_2(max(num_heads, k.shape[1])), max(TILE // block_half, 1))
    _rotary_kernel[(triton.cdiv(num_tokens, block_t),)](
        q, k, positions, inv_freq,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        num_tokens, num_heads, k.shape[1], half,
        BLOCK_T=block_t,
        BLOCK_H=block_h,
        BLOCK_HALF=block_half,
        PRECISE_TRIG=not interpreted(),
        num_warps=4,
    )  # fmt: skip

"""Extend (prefill) attention over the paged KV pool.

A batch of requests each adds ``extend_lens[b]`` tokens at positions
``prefix_lens[b] .. prefix_lens[b] + extend_lens[b] - 1``. Their K/V are already
in the pool, so every key, cached prefix and new token alike, is read from the
pool through ``req_to_token``: the new tokens attend causally to themselves and
to their cached prefix (radix-cache hits, chunked prefill, decode as an extend of 1).

Batch and prefix invariance: a query row's output is bit-identical whatever the
other requests in the batch, ``max_extend_len`` or the split of its sequence into
prefix and extend (one extend of 10, or 6 then 4). Both tile grids are anchored at
position 0: the query at position p is row p % BLOCK_M of query block p // BLOCK_M
(a block may hold rows of the prefix or past the extend, masked), and keys are visited
in order in BLOCK_N tiles starting at multiples of BLOCK_N. Every tile is a full
[BLOCK_M, BLOCK_N] block, so a row meets the same shapes, in the same place, in the
same order; position-anchored query blocks matter because a row's result may depend
on its index in the tile (numpy's matmul under the interpreter does). Only the number
of trailing key tiles, which the row cannot see, varies with the sequence length, and
such tiles are exact no-ops of the online softmax. With a window, key tiles wholly
before the block's first window are skipped; that start is also on the grid.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels import interpreted
from kernels.paged_checks import INDEX_DTYPES, check_index, check_paged

_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def extend_attention_ref(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Torch reference, one request at a time, softmax in float32.

    q: [num_tokens, num_heads, head_dim]; k_buf, v_buf: [num_kv_heads, num_slots, head_dim].
    Returns [num_tokens, num_heads, head_dim] in q's dtype.
    """
    group = q.shape[1] // k_buf.shape[0]
    out = torch.empty_like(q)
    start = 0
    for row, prefix_len, extend_len in zip(
        req_rows.tolist(), prefix_lens.tolist(), extend_lens.tolist(), strict=True
    ):
        seq_len = prefix_len + extend_len
        slots = req_to_token[row, :seq_len].long()
        keys = k_buf[:, slots].float().repeat_interleave(group, 0)  # [num_heads, seq_len, D]
        values = v_buf[:, slots].float().repeat_interleave(group, 0)
        queries = q[start : start + extend_len].float().transpose(0, 1)  # [num_heads, ext, D]
        scores = queries @ keys.transpose(1, 2) * scale  # [num_heads, extend_len, seq_len]
        q_pos = torch.arange(prefix_len, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        visible = k_pos <= q_pos
        if window is not None:
            visible &= k_pos > q_pos - window
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out[start : start + extend_len] = (probs @ values).transpose(0, 1).to(q.dtype)
        start += extend_len
    return out


@triton.jit
def _extend_attention_kernel(
    q_ptr,
    k_buf_ptr,
    v_buf_ptr,
    out_ptr,
    req_to_token_ptr,
    req_rows_ptr,
    prefix_lens_ptr,
    extend_lens_ptr,
    q_starts_ptr,
    scale_log2e,
    window,
    group_size,
    head_dim,
    stride_q_t,
    stride_q_h,
    stride_k_h,
    stride_k_s,
    stride_v_h,
    stride_v_s,
    stride_o_t,
    stride_o_h,
    stride_table_r,
    stride_table_p,
    USE_WINDOW: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # one program per (request, query block, query head). Query blocks, like key tiles,
    # sit on a grid of positions anchored at 0: position p is always row p % BLOCK_M of
    # its tile, whatever the prefix/extend split (see the module docstring)
    req = tl.program_id(0)
    head = tl.program_id(2)
    prefix_len = tl.load(prefix_lens_ptr + req).to(tl.int64)
    seq_len = prefix_len + tl.load(extend_lens_ptr + req).to(tl.int64)
    block_start = (prefix_len // BLOCK_M + tl.program_id(1)) * BLOCK_M
    if block_start >= seq_len:
        return  # the grid is sized for the longest extend in the batch
    q_start = tl.load(q_starts_ptr + req).to(tl.int64)
    table_row = req_to_token_ptr + tl.load(req_rows_ptr + req).to(tl.int64) * stride_table_r
    kv_head = (head // group_size).to(tl.int64)

    q_pos = block_start + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = (q_pos >= prefix_len) & (q_pos < seq_len)  # this launch's new tokens
    d_ok = offs_d < head_dim
    token = q_start + q_pos - prefix_len
    q = tl.load(
        q_ptr + token[:, None] * stride_q_t + head * stride_q_h + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    ).to(DOT_DTYPE)  # [BLOCK_M, BLOCK_D]

    # keys [lo, hi): hi is one past the last position this block's rows can see; lo stays
    # on the BLOCK_N grid anchored at 0, skipping only tiles before every row's window
    hi = tl.minimum(block_start + BLOCK_M, seq_len)
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(block_start - window + 1, 0) // BLOCK_N * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n_start in range(lo, hi, BLOCK_N):
        k_pos = n_start + offs_n
        k_ok = k_pos < hi
        slot = tl.load(table_row + k_pos * stride_table_p, mask=k_ok, other=0).to(tl.int64)
        k_t = tl.load(
            k_buf_ptr + kv_head * stride_k_h + slot[None, :] * stride_k_s + offs_d[:, None],
            mask=d_ok[:, None] & k_ok[None, :],
            other=0.0,
        ).to(DOT_DTYPE)  # [BLOCK_D, BLOCK_N]
        scores = tl.dot(q, k_t, input_precision=DOT_PRECISION) * scale_log2e
        visible = k_pos[None, :] <= q_pos[:, None]
        if USE_WINDOW:
            visible &= k_pos[None, :] > q_pos[:, None] - window
        scores = tl.where(visible, scores, float("-inf"))
        # online softmax in base 2. A tile a row cannot see leaves its (m, l, acc) bit-exact:
        # alpha is exp2(0) == 1 (or 0 times a zero acc), p is 0 and adds exact zeros.
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no -inf - -inf
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_buf_ptr + kv_head * stride_v_h + slot[:, None] * stride_v_s + offs_d[None, :],
            mask=k_ok[:, None] & d_ok[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_D]
        p = p.to(v.dtype).to(DOT_DTYPE)  # p rounded to the pool's dtype, as flash attention
        acc = tl.dot(p, v.to(DOT_DTYPE), acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new

    # rows that are not this launch's tokens are not stored; with a window they may
    # have seen no key at all (l == 0)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        out_ptr + token[:, None] * stride_o_t + head * stride_o_h + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )


def extend_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    *,
    q_starts: torch.Tensor | None = None,
    max_extend_len: int | None = None,
    out: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Causal attention of each request's new tokens over its whole sequence in the pool.

    q: [num_tokens, num_heads, head_dim], request b's ``extend_lens[b]`` tokens contiguous,
    in batch order. k_buf, v_buf: [num_kv_heads, num_slots, head_dim], q's dtype, any
    strides but a unit last one; they already hold the new tokens' K/V. Query head h reads
    kv head ``h // (num_heads // num_kv_heads)``. req_to_token: [rows, max_context] int32
    or int64, position p of request b in slot ``req_to_token[req_rows[b], p]``.
    req_rows, prefix_lens, extend_lens: [bs] int32/int64. A query at position p sees keys
    at positions <= p and, with a window, > p - window.

    q_starts ([bs] or [bs + 1], request b's first row of q) and max_extend_len (only sizes
    the grid; must be >= every extend_lens[b]) are computed on the host when not given.
    block_m, block_n: powers of two >= 16; defaults 16/32 under the interpreter, 64/64 on
    a GPU, never derived from the batch. Returns out ([num_tokens, num_heads, head_dim],
    q's dtype), written in place when given.
    """
    out = check_paged(q, k_buf, v_buf, req_to_token, window, out)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[0]
    if extend_lens.dim() != 1 or extend_lens.dtype not in INDEX_DTYPES:
        raise ValueError(f"extend_lens must be int32/int64 [bs], got {extend_lens.dtype}")
    bs = extend_lens.shape[0]
    check_index("req_rows", req_rows, bs)
    check_index("prefix_lens", prefix_lens, bs)
    if q_starts is None:
        q_starts = torch.cumsum(extend_lens, 0) - extend_lens
    elif q_starts.shape not in ((bs,), (bs + 1,)) or q_starts.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"q_starts must be int32/int64 [{bs}] or [{bs + 1}], "
            f"got {q_starts.dtype} {tuple(q_starts.shape)}"
        )
    if max_extend_len is None:
        # host sync; the total is checked here, where it costs nothing more
        max_extend_len = int(extend_lens.max()) if bs else 0
        if int(extend_lens.sum()) != num_tokens:
            raise ValueError(
                f"extend_lens sum to {int(extend_lens.sum())} but q has {num_tokens} tokens"
            )
    tensors = (q, k_buf, v_buf, out, req_to_token, req_rows, prefix_lens, extend_lens, q_starts)
    if len({t.device for t in tensors}) != 1:
        raise ValueError("every tensor argument must be on one device")
    if not all(t.is_contiguous() for t in (req_rows, prefix_lens, extend_lens, q_starts)):
        raise ValueError("req_rows, prefix_lens, extend_lens and q_starts must be contiguous")
    block_m = block_m or (16 if interpreted() else 64)
    block_n = block_n or (32 if interpreted() else 64)
    for name, block in (("block_m", block_m), ("block_n", block_n)):
        if block < 16 or block & (block - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot), got {block}")
    if bs == 0 or max_extend_len == 0:
        return out

    # a request's new tokens span at most this many position-aligned query blocks
    grid = (bs, triton.cdiv(max_extend_len + block_m - 1, block_m), num_heads)
    # the interpreter's tl.dot multiplies bfloat16 as raw uint16 bits: upcast there (exact)
    bf16_interpreted = q.dtype == torch.bfloat16 and interpreted()
    _extend_attention_kernel[grid](
        q,
        k_buf,
        v_buf,
        out,
        req_to_token,
        req_rows,
        prefix_lens,
        extend_lens,
        q_starts,
        scale * math.log2(math.e),
        window or 0,
        num_heads // num_kv_heads,
        head_dim,
        q.stride(0),
        q.stride(1),
        k_buf.stride(0),
        k_buf.stride(1),
        v_buf.stride(0),
        v_buf.stride(1),
        out.stride(0),
        out.stride(1),
        req_to_token.stride(0),
        req_to_token.stride(1),
        USE_WINDOW=window is not None,
        DOT_DTYPE=tl.float32 if bf16_interpreted else _TL_DTYPES[q.dtype],
        # fp32 inputs: full-precision dot, not TF32 (ignored for 16-bit inputs)
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=max(triton.next_power_of_2(head_dim), 16),
    )
    return out

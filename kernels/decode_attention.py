"""Paged decode attention straight from the KV pool (split-K, "flash-decoding").

Each request has one query, the token at position ``seq_len - 1``, whose K/V
are already in the pool. Its keys are found through ``req_to_token``: position
``p`` of row ``r`` lives in slot ``req_to_token[r, p]`` of the pool buffers
[num_kv_heads, num_slots, head_dim], so page size does not matter here.

Stage 1, grid (bs, num_kv_heads, num_splits): one program takes every query
head of a kv-head group (K/V are read once per group) over the keys
[split * split_size, min((split + 1) * split_size, seq_len)), in BLOCK_N tiles,
and writes the normalised partial output and its log-sum-exp to float32
scratch. Stage 2, grid (bs, num_heads): merges a request's splits in order.
Scores are kept in base 2 (``scale * log2(e)``) so the kernels use exp2.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels import interpreted
from kernels.paged_checks import check_index, check_paged

BLOCK_N = 32  # keys per tile; split_size must be a multiple of it
NO_WINDOW = 2**31 - 1  # a window no sequence reaches: every key visible


def decode_attention_ref(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Torch reference, one request at a time; softmax in float32, output in q's dtype."""
    num_heads = q.shape[1]
    group = num_heads // k_buf.shape[0]
    out = torch.empty_like(q)
    for b, (row, seq_len) in enumerate(zip(req_rows.tolist(), seq_lens.tolist(), strict=True)):
        start = 0 if window is None else max(seq_len - window, 0)
        slots = req_to_token[row, start:seq_len].long()
        keys = k_buf[:, slots].float().repeat_interleave(group, dim=0)  # [num_heads, n, head_dim]
        values = v_buf[:, slots].float().repeat_interleave(group, dim=0)
        scores = torch.einsum("hd,hnd->hn", q[b].float(), keys) * scale
        out[b] = torch.einsum("hn,hnd->hd", scores.softmax(dim=-1), values).to(q.dtype)
    return out


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_buf_ptr,
    v_buf_ptr,
    req_to_token_ptr,
    req_rows_ptr,
    seq_lens_ptr,
    mid_o_ptr,
    mid_lse_ptr,
    stride_q_b,
    stride_q_h,
    stride_k_h,
    stride_k_s,
    stride_v_h,
    stride_v_s,
    stride_r2t_row,
    stride_r2t_pos,
    stride_rows,
    stride_lens,
    stride_mo_b,
    stride_mo_h,
    stride_mo_s,
    stride_ml_b,
    stride_ml_h,
    scale_log2,
    window,
    split_size,
    group,
    head_dim,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(req_rows_ptr + b * stride_rows).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b * stride_lens).to(tl.int32)
    # keys before the window start are skipped: their tiles, and whole splits, are empty
    lo = tl.maximum(split * split_size, tl.maximum(seq_len - window, 0))
    hi = tl.minimum((split + 1) * split_size, seq_len)

    # an empty split (past seq_len, or before the window) writes nothing: stage 2 reads
    # only the splits that hold keys, so it never meets an lse of -inf or a 0 / 0
    if lo < hi:
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        heads = kv_head * group + offs_h  # the group's query heads, padded to BLOCK_H
        mask_hd = (offs_h < group)[:, None] & (offs_d < head_dim)[None, :]
        q_ptrs = q_ptr + b * stride_q_b + heads[:, None] * stride_q_h + offs_d[None, :]
        q = tl.load(q_ptrs, mask=mask_hd, other=0.0).to(DOT_DTYPE)  # [BLOCK_H, BLOCK_D]

        k_base = k_buf_ptr + kv_head.to(tl.int64) * stride_k_h
        v_base = v_buf_ptr + kv_head.to(tl.int64) * stride_v_h
        r2t_base = req_to_token_ptr + row * stride_r2t_row
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.full([BLOCK_H], 0.0, tl.float32)
        acc = tl.full([BLOCK_H, BLOCK_D], 0.0, tl.float32)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            mask_n = offs_n < hi
            slots = tl.load(r2t_base + offs_n * stride_r2t_pos, mask=mask_n, other=0)
            slots = slots.to(tl.int64)
            mask_nd = mask_n[:, None] & (offs_d < head_dim)[None, :]
            k_ptrs = k_base + slots[:, None] * stride_k_s + offs_d[None, :]
            k = tl.load(k_ptrs, mask=mask_nd, other=0.0).to(DOT_DTYPE)  # [BLOCK_N, BLOCK_D]
            # ieee: float32 stays float32 (no tf32); 16-bit inputs ignore it
            qk = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2
            qk = tl.where(mask_n[None, :], qk, float("-inf"))  # [BLOCK_H, BLOCK_N]
            m_new = tl.maximum(m_i, tl.max(qk, 1))  # finite: every tile holds a key
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v_ptrs = v_base + slots[:, None] * stride_v_s + offs_d[None, :]
            v = tl.load(v_ptrs, mask=mask_nd, other=0.0).to(DOT_DTYPE)
            pv = tl.dot(p.to(DOT_DTYPE), v, input_precision="ieee")
            acc = acc * alpha[:, None] + pv
            m_i = m_new

        # l_i > 0 on every row, the padded heads' too (their q is 0, so p = 1)
        mo_ptrs = mid_o_ptr + b * stride_mo_b + split * stride_mo_s
        mo_ptrs += heads[:, None] * stride_mo_h + offs_d[None, :]
        tl.store(mo_ptrs, acc / l_i[:, None], mask=mask_hd)
        ml_ptrs = mid_lse_ptr + b * stride_ml_b + heads * stride_ml_h + split
        tl.store(ml_ptrs, m_i + tl.log2(l_i), mask=offs_h < group)


@triton.jit
def _decode_merge_kernel(
    mid_o_ptr,
    mid_lse_ptr,
    seq_lens_ptr,
    out_ptr,
    stride_mo_b,
    stride_mo_h,
    stride_mo_s,
    stride_ml_b,
    stride_ml_h,
    stride_lens,
    stride_out_b,
    stride_out_h,
    window,
    split_size,
    num_splits,
    head_dim,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b * stride_lens).to(tl.int32)
    # only the splits holding visible keys, each non-empty; the rest are never read
    first = tl.maximum(seq_len - window, 0) // split_size
    last = tl.minimum((seq_len + split_size - 1) // split_size, num_splits)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    mo_base = mid_o_ptr + b * stride_mo_b + head * stride_mo_h
    ml_base = mid_lse_ptr + b * stride_ml_b + head * stride_ml_h
    m = tl.full([1], float("-inf"), tl.float32)
    l_sum = tl.full([1], 0.0, tl.float32)
    acc = tl.full([BLOCK_D], 0.0, tl.float32)
    for split in range(first, last):
        lse = tl.load(ml_base + split)
        o = tl.load(mo_base + split * stride_mo_s + offs_d, mask=mask_d, other=0.0)
        m_new = tl.maximum(m, lse)
        alpha = tl.exp2(m - m_new)
        weight = tl.exp2(lse - m_new)
        acc = acc * alpha + weight * o
        l_sum = l_sum * alpha + weight
        m = m_new
    out = acc / tl.where(l_sum > 0.0, l_sum, 1.0)  # seq_len 0: zeros
    out_ptrs = out_ptr + b * stride_out_b + head * stride_out_h + offs_d
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_d)


def _dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """The tl.dot operand type: the inputs' own, for tensor cores.

    Triton's interpreter (3.9) multiplies bfloat16 as its raw uint16 bits, so there the
    operands go up to float32 instead (exact, and the products are summed in float32 anyway).
    """
    if dtype == torch.bfloat16:
        return tl.float32 if interpreted() else tl.bfloat16
    return tl.float16 if dtype == torch.float16 else tl.float32


def decode_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    *,
    split_size: int = 256,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of each request's last token over its keys in the pool.

    q: [bs, num_heads, head_dim]. k_buf, v_buf: [num_kv_heads, num_slots, head_dim], any
    strides but a unit last one; q's dtype. Query head h reads kv head
    ``h // (num_heads // num_kv_heads)``. req_to_token: [max_reqs, max_context] int32 or
    int64 slot ids. req_rows: [bs] rows of req_to_token. seq_lens: [bs] keys per request,
    the query's own included (a request with seq_len 0 gets zeros). window: the query at
    position p sees keys at positions in (p - window, p]; None: all of them.

    split_size: keys per stage-1 program, a multiple of BLOCK_N. num_splits: stage-1
    programs per (request, kv head); None computes ceil(max(seq_lens) / split_size), which
    syncs with the device. Pass it to fix the grid (CUDA graphs); it must be at least
    that value, or the keys past num_splits * split_size are dropped. out: an optional
    [bs, num_heads, head_dim] tensor of q's dtype to write into. Returns out.
    """
    out = check_paged(q, k_buf, v_buf, req_to_token, window, out)
    bs, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[0]
    check_index("req_rows", req_rows, bs)
    check_index("seq_lens", seq_lens, bs)
    if len({t.device for t in (q, k_buf, v_buf, req_to_token, req_rows, seq_lens, out)}) != 1:
        raise ValueError("every tensor must be on q's device")
    if split_size <= 0 or split_size % BLOCK_N != 0:
        raise ValueError(f"split_size must be a positive multiple of {BLOCK_N}, got {split_size}")
    if bs == 0:
        return out
    if num_splits is None:
        num_splits = max(1, triton.cdiv(int(seq_lens.max()), split_size))
    elif num_splits < 1:
        raise ValueError(f"num_splits must be at least 1, got {num_splits}")

    window_arg = NO_WINDOW if window is None else window
    block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs dims >= 16
    mid_o = torch.empty(bs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(bs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    group = num_heads // num_kv_heads
    _decode_split_kernel[(bs, num_kv_heads, num_splits)](
        q,
        k_buf,
        v_buf,
        req_to_token,
        req_rows,
        seq_lens,
        mid_o,
        mid_lse,
        q.stride(0),
        q.stride(1),
        k_buf.stride(0),
        k_buf.stride(1),
        v_buf.stride(0),
        v_buf.stride(1),
        req_to_token.stride(0),
        req_to_token.stride(1),
        req_rows.stride(0),
        seq_lens.stride(0),
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        scale * math.log2(math.e),
        window_arg,
        split_size,
        group,
        head_dim,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d,
        BLOCK_N=BLOCK_N,
        DOT_DTYPE=_dot_dtype(q.dtype),
    )
    _decode_merge_kernel[(bs, num_heads)](
        mid_o,
        mid_lse,
        seq_lens,
        out,
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        seq_lens.stride(0),
        out.stride(0),
        out.stride(1),
        window_arg,
        split_size,
        num_splits,
        head_dim,
        BLOCK_D=block_d,
    )
    return out

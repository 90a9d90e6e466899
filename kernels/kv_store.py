"""Store new tokens' K and V into the pool: ``k_buf[:, out_loc[t], :] = k[t]``.

The pool buffers are [num_kv_heads, num_slots, head_dim] per layer, last dim
contiguous; every other stride is passed to the kernel, so a [num_slots,
num_kv_heads, head_dim] buffer viewed through a transpose works too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import interpreted

KV_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# tokens per program: 1 natively; the interpreter pays per program (and per op), not
# per element, so it copies [BLOCK_T, head_dim] tiles
INTERPRETED_BLOCK_T = 16


def store_kv_ref(
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out_loc: torch.Tensor,
) -> None:
    """Torch reference: write k[t], v[t] ([num_kv_heads, head_dim]) into slot out_loc[t]."""
    k_buf[:, out_loc, :] = k.transpose(0, 1)
    v_buf[:, out_loc, :] = v.transpose(0, 1)


@triton.jit
def _store_kv_kernel(
    k_buf_ptr,
    v_buf_ptr,
    k_ptr,
    v_ptr,
    out_loc_ptr,
    stride_kb_h,
    stride_kb_s,
    stride_vb_h,
    stride_vb_s,
    stride_k_t,
    stride_k_h,
    stride_v_t,
    stride_v_h,
    stride_loc,
    num_tokens,
    head_dim,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # one program per (block of BLOCK_T tokens, kv head)
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1).to(tl.int64)
    token_mask = tokens < num_tokens
    slots = tl.load(out_loc_ptr + tokens * stride_loc, mask=token_mask, other=0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    mask = token_mask[:, None] & (offs_d < head_dim)
    tokens, slots = tokens[:, None], slots[:, None]
    k = tl.load(k_ptr + tokens * stride_k_t + head * stride_k_h + offs_d, mask=mask)
    v = tl.load(v_ptr + tokens * stride_v_t + head * stride_v_h + offs_d, mask=mask)
    tl.store(k_buf_ptr + head * stride_kb_h + slots * stride_kb_s + offs_d, k, mask=mask)
    tl.store(v_buf_ptr + head * stride_vb_h + slots * stride_vb_s + offs_d, v, mask=mask)


def store_kv(
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out_loc: torch.Tensor,
) -> None:
    """Write k[t], v[t] into slot ``out_loc[t]`` of k_buf, v_buf, in place.

    k_buf, v_buf: [num_kv_heads, num_slots, head_dim], any strides but a unit last one.
    k, v: [num_tokens, num_kv_heads, head_dim], the buffers' dtype, unit last stride.
    out_loc: [num_tokens] int64 slot ids (not checked against num_slots).
    """
    if k_buf.dim() != 3 or v_buf.shape != k_buf.shape:
        raise ValueError(
            f"k_buf and v_buf must both be [num_kv_heads, num_slots, head_dim], "
            f"got {tuple(k_buf.shape)} and {tuple(v_buf.shape)}"
        )
    num_kv_heads, _, head_dim = k_buf.shape
    if k.dim() != 3 or k.shape[1:] != (num_kv_heads, head_dim) or v.shape != k.shape:
        raise ValueError(
            f"k and v must both be [num_tokens, {num_kv_heads}, {head_dim}] to match the "
            f"buffers, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    num_tokens = k.shape[0]
    if out_loc.shape != (num_tokens,) or out_loc.dtype != torch.int64:
        raise ValueError(
            f"out_loc must be int64 [{num_tokens}], got {out_loc.dtype} {tuple(out_loc.shape)}"
        )
    if k_buf.dtype not in KV_DTYPES or {v_buf.dtype, k.dtype, v.dtype} != {k_buf.dtype}:
        raise ValueError(
            f"k_buf, v_buf, k and v must share one dtype of {KV_DTYPES}, got "
            f"{k_buf.dtype}, {v_buf.dtype}, {k.dtype}, {v.dtype}: cast k and v to the pool's"
        )
    if (k_buf.stride(2), v_buf.stride(2), k.stride(2), v.stride(2)) != (1, 1, 1, 1):
        raise ValueError(
            f"the head_dim axis must be contiguous (stride 1), got strides {k_buf.stride(2)}, "
            f"{v_buf.stride(2)} (buffers), {k.stride(2)} (k), {v.stride(2)} (v)"
        )
    if len({t.device for t in (k_buf, v_buf, k, v, out_loc)}) != 1:
        raise ValueError("k_buf, v_buf, k, v and out_loc must be on one device")
    if num_tokens == 0:
        return
    block_t = INTERPRETED_BLOCK_T if interpreted() else 1
    _store_kv_kernel[(triton.cdiv(num_tokens, block_t), num_kv_heads)](
        k_buf,
        v_buf,
        k,
        v,
        out_loc,
        k_buf.stride(0),
        k_buf.stride(1),
        v_buf.stride(0),
        v_buf.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out_loc.stride(0),
        num_tokens,
        head_dim,
        BLOCK_T=block_t,
        BLOCK_D=triton.next_power_of_2(head_dim),
    )

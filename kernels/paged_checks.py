"""The checks both paged-attention launchers make of their pool, table and output."""

from __future__ import annotations

import torch

QKV_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_index(name: str, t: torch.Tensor, bs: int) -> None:
    """``t`` is a [bs] int32/int64 tensor."""
    if t.shape != (bs,) or t.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name} must be int32/int64 [{bs}], got {t.dtype} {tuple(t.shape)}")


def check_paged(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    window: int | None,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """Raise ValueError unless q [tokens, num_heads, head_dim] fits the pool's k_buf and
    v_buf [num_kv_heads, num_slots, head_dim] and the table; returns ``out``, or a new one."""
    if q.dim() != 3 or k_buf.dim() != 3 or v_buf.shape != k_buf.shape:
        raise ValueError(
            f"expected q [tokens, num_heads, head_dim] and k_buf, v_buf both "
            f"[num_kv_heads, num_slots, head_dim], got {tuple(q.shape)}, "
            f"{tuple(k_buf.shape)}, {tuple(v_buf.shape)}"
        )
    _, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[0]
    if k_buf.shape[2] != head_dim:
        raise ValueError(f"q has head_dim {head_dim}, the pool {k_buf.shape[2]}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    if q.dtype not in QKV_DTYPES or {k_buf.dtype, v_buf.dtype} != {q.dtype}:
        raise ValueError(
            f"q, k_buf and v_buf must share one dtype of {QKV_DTYPES}, "
            f"got {q.dtype}, {k_buf.dtype}, {v_buf.dtype}"
        )
    if req_to_token.dim() != 2 or req_to_token.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"req_to_token must be a 2-D int32/int64 table [rows, max_context], "
            f"got {req_to_token.dtype} {tuple(req_to_token.shape)}"
        )
    if window is not None and window < 1:
        raise ValueError(f"window must be None or at least 1, got {window}")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError(
            f"out must be {q.dtype} {tuple(q.shape)} like q, got {out.dtype} {tuple(out.shape)}"
        )
    if (q.stride(2), k_buf.stride(2), v_buf.stride(2), out.stride(2)) != (1, 1, 1, 1):
        raise ValueError("the head_dim axis of q, k_buf, v_buf and out must have stride 1")
    return out

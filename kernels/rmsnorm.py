"""RMSNorm, optionally fused with the residual add that precedes it.

Matches ``rt.gpu.models.llama.RMSNorm`` bit for bit in its roundings: the row is
normalised in float32, cast to the input dtype, then multiplied by the weight
in that dtype. A program normalises a fixed number of rows (one on a GPU, 16
under the interpreter), each reduced alone with a block size fixed by the
hidden size, so a row's result does not depend on how many rows share the
launch (batch invariance).
"""

from __future__ import annotations

from typing import overload

import torch
import triton
import triton.language as tl

from kernels import interpreted

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HIDDEN = 65536  # one block holds a whole row


@overload
def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: None = None
) -> torch.Tensor: ...
@overload
def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]: ...
def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Torch reference: ``normed(x)``, or ``(normed(x + residual), x + residual)``.

    Unlike :func:`rms_norm` it leaves ``residual`` untouched.
    """
    if residual is not None:
        x = x + residual
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    normed = weight * x32.to(x.dtype)
    return normed if residual is None else (normed, x)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    stride_x0,
    stride_x1,
    stride_r0,
    stride_r1,
    stride_o0,
    stride_o1,
    n0,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
):
    # ROWS rows per program: x[i0, i1, :] of a [n0, n1, hidden] view for ROWS values of
    # i0. Each row is reduced on its own, so its result does not depend on its neighbours.
    i0 = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]  # [ROWS, 1]
    i1 = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK)[None, :]  # [1, BLOCK]
    mask = (i0 < n0) & (cols < hidden)
    x = tl.load(x_ptr + i0 * stride_x0 + i1 * stride_x1 + cols, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_RESIDUAL:
        r_ptrs = residual_ptr + i0 * stride_r0 + i1 * stride_r1 + cols
        r = tl.load(r_ptrs, mask=mask, other=0.0)
        # the sum is rounded to the input dtype, as torch's ``x + residual`` is
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)
        tl.store(r_ptrs, x, mask=mask)
    x32 = x.to(tl.float32)
    mean_sq = tl.sum(x32 * x32, axis=1)[:, None] / hidden  # [ROWS, 1]
    normed = (x32 * (1.0 / tl.sqrt(mean_sq + eps))).to(dtype)
    w = tl.load(weight_ptr + cols, mask=cols < hidden, other=0.0)
    out = (normed.to(tl.float32) * w.to(tl.float32)).to(dtype)
    tl.store(out_ptr + i0 * stride_o0 + i1 * stride_o1 + cols, out, mask=mask)


@overload
def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: None = None
) -> torch.Tensor: ...
@overload
def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]: ...
def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of the rows of ``x``; with ``residual``, of ``x + residual`` (fused).

    ``x``: ``[num_rows, hidden]`` or ``[num_tokens, num_heads, head_dim]`` (per-head
    q/k norm), any strides with the last one 1; ``weight``: ``[hidden]``, same dtype.

    Without ``residual`` returns a new, contiguous ``normed(x)``. With it, returns
    ``(normed(h), residual)`` where ``h = x + residual`` (rounded to the dtype):
    ``residual`` is updated IN PLACE to hold ``h``, and it is that same tensor that
    is returned, so ``x, residual = rms_norm(x, w, eps, residual)`` chains layers.
    """
    assert x.dtype in DTYPES, f"x.dtype={x.dtype}; expected one of {DTYPES}"
    assert x.dim() in (2, 3), f"x.shape={tuple(x.shape)}; expected 2-D or 3-D rows"
    hidden = x.shape[-1]
    assert 0 < hidden <= MAX_HIDDEN, f"hidden={hidden}; expected 1..{MAX_HIDDEN}"
    assert x.stride(-1) == 1, f"x.stride()={x.stride()}; the last dim must be contiguous"
    assert weight.shape == (hidden,), f"weight.shape={tuple(weight.shape)}; expected ({hidden},)"
    assert weight.dtype == x.dtype, f"weight.dtype={weight.dtype} differs from x.dtype={x.dtype}"
    assert weight.stride(-1) == 1, f"weight.stride()={weight.stride()}; expected contiguous"
    if residual is not None:
        assert residual.shape == x.shape, (
            f"residual.shape={tuple(residual.shape)} differs from x.shape={tuple(x.shape)}"
        )
        assert residual.dtype == x.dtype, (
            f"residual.dtype={residual.dtype} differs from x.dtype={x.dtype}"
        )
        assert residual.stride(-1) == 1, (
            f"residual.stride()={residual.stride()}; the last dim must be contiguous"
        )
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    # a [n0, n1, hidden] view of every operand, so strided 3-D input needs no copy
    x3, out3 = (x, out) if x.dim() == 3 else (x[:, None], out[:, None])
    r3 = x3 if residual is None else (residual if x.dim() == 3 else residual[:, None])
    n0, n1 = x3.shape[0], x3.shape[1]
    if n0 * n1 > 0:
        block = triton.next_power_of_2(hidden)
        # the interpreter pays per program, a GPU wants many: rows per program differ
        rows = 16 if interpreted() else 1
        _rms_norm_kernel[(triton.cdiv(n0, rows), n1)](
            x3, r3, weight, out3,
            x3.stride(0), x3.stride(1),
            r3.stride(0), r3.stride(1),
            out3.stride(0), out3.stride(1),
            n0, hidden, eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            ROWS=rows,
            num_warps=min(max(block // 256, 1), 16),
        )  # fmt: skip
    return out if residual is None else (out, residual)

"""SiLU-and-multiply of a fused gate/up projection (the Llama MLP activation).

``x = [gate | up]`` along the last dim; the result ``silu(gate) * up`` is computed
in float32 and rounded once to x's dtype. One program handles one block of one
row, so a row's result does not depend on the number of rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BLOCK = 1024


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Torch reference: ``silu(gate) * up`` in float32, cast to x's dtype."""
    gate, up = x.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    stride_x_row,
    stride_out_row,
    inter,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate_ptrs = x_ptr + row * stride_x_row + cols
    gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_ptrs + inter, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_out_row + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(x[:, :inter]) * x[:, inter:]`` for ``x``: ``[num_tokens, 2 * inter]``.

    Writes into ``out`` (``[num_tokens, inter]``, x's dtype, last dim contiguous) when
    given, else into a new tensor; returns it. Rows of ``x`` may be strided.
    """
    assert x.dtype in DTYPES, f"x.dtype={x.dtype}; expected one of {DTYPES}"
    assert x.dim() == 2, f"x.shape={tuple(x.shape)}; expected [num_tokens, 2 * inter]"
    num_tokens, width = x.shape
    assert width % 2 == 0, f"x.shape={tuple(x.shape)}; the last dim (gate | up) must be even"
    assert x.stride(-1) == 1, f"x.stride()={x.stride()}; the last dim must be contiguous"
    inter = width // 2
    if out is None:
        out = torch.empty((num_tokens, inter), dtype=x.dtype, device=x.device)
    assert out.shape == (num_tokens, inter), (
        f"out.shape={tuple(out.shape)}; expected ({num_tokens}, {inter})"
    )
    assert out.dtype == x.dtype, f"out.dtype={out.dtype} differs from x.dtype={x.dtype}"
    assert out.stride(-1) == 1, f"out.stride()={out.stride()}; the last dim must be contiguous"
    if num_tokens > 0 and inter > 0:
        block = min(BLOCK, triton.next_power_of_2(inter))
        grid = (num_tokens, triton.cdiv(inter, block))
        _silu_and_mul_kernel[grid](
            x, out, x.stride(0), out.stride(0), inter, BLOCK=block, num_warps=4
        )
    return out

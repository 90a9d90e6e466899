"""kernels.silu_mul against its torch reference (and the model's TorchOps.silu_mul)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import device_type
from kernels.silu_mul import silu_and_mul, silu_and_mul_ref
from rt.gpu.models.ops import TorchOps

# float32: the kernel's exp and division against torch's silu, a few float32 ulps.
# bfloat16: one rounding of the float32 result (ulp 2**-8 relative; the interpreter
# truncates), against the model's silu-then-multiply, which rounds twice.
TOLERANCES = {torch.float32: (1e-6, 1e-6), torch.bfloat16: (2e-2, 2e-2)}
DEVICE = torch.device(device_type())


def _gate_up(tokens: int, inter: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(tokens * 1000 + inter)
    return torch.randn(tokens, 2 * inter, generator=gen).mul_(3.0).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inter", [128, 96, 200])
@pytest.mark.parametrize("tokens", [1, 4, 13])
def test_silu_and_mul(tokens: int, inter: int, dtype: torch.dtype) -> None:
    x = _gate_up(tokens, inter, dtype)
    atol, rtol = TOLERANCES[dtype]
    out = silu_and_mul(x)
    assert out.shape == (tokens, inter) and out.dtype == dtype
    torch.testing.assert_close(out, silu_and_mul_ref(x), atol=atol, rtol=rtol)
    # the model's ops, in x's dtype
    torch.testing.assert_close(out, TorchOps().silu_mul(x), atol=atol, rtol=rtol)
    gate, up = x.float().chunk(2, dim=-1)
    torch.testing.assert_close(out.float(), F.silu(gate) * up, atol=atol, rtol=rtol)


def test_silu_and_mul_into_out_from_strided_rows() -> None:
    wide = _gate_up(6, 100, torch.float32)  # rows of 200 of which the first 2 * 64 are used
    x = wide[:, : 2 * 64]
    out = torch.full((6, 64), float("nan"), device=DEVICE)
    assert silu_and_mul(x, out) is out
    torch.testing.assert_close(out, silu_and_mul_ref(x), atol=1e-6, rtol=1e-6)


def test_silu_and_mul_rejects_bad_input() -> None:
    x = _gate_up(4, 64, torch.float32)
    with pytest.raises(AssertionError, match=r"out\.shape"):
        silu_and_mul(x, torch.empty(4, 128, device=DEVICE))
    with pytest.raises(AssertionError, match=r"x\.dtype"):
        silu_and_mul(x.double())
    with pytest.raises(AssertionError, match="must be even"):
        silu_and_mul(x[:, :127])
    with pytest.raises(AssertionError, match="contiguous"):
        silu_and_mul(x.t())

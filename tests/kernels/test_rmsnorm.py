"""kernels.rmsnorm against its torch reference (and llama.py's RMSNorm)."""

from __future__ import annotations

import pytest
import torch

from kernels import device_type
from kernels.rmsnorm import rms_norm, rms_norm_ref
from rt.gpu.models.ops import TorchOps

# float32: only the reduction order differs. bfloat16: the results are rounded
# to bfloat16 (ulp 2**-8 relative); a rounding that lands the other side of a
# tie (and the interpreter truncates where the GPU rounds) is one ulp, about
# 0.4% of the value, so atol = rtol = 2e-2 holds with margin.
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}
EPS = 1e-6
DEVICE = torch.device(device_type())


def _inputs(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen).mul_(3.0).to(DEVICE, dtype)
    weight = (1.0 + 0.5 * torch.randn(shape[-1], generator=gen)).to(DEVICE, dtype)
    return x, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 96, 100])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_rms_norm(rows: int, hidden: int, dtype: torch.dtype) -> None:
    x, weight = _inputs((rows, hidden), dtype)
    atol, rtol = TOLERANCES[dtype]
    out = rms_norm(x, weight, EPS)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out, rms_norm_ref(x, weight, EPS), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "hidden"), [(1, 64), (3, 100), (17, 96)])
def test_rms_norm_fused_residual_updates_residual_in_place(
    rows: int, hidden: int, dtype: torch.dtype
) -> None:
    x, weight = _inputs((rows, hidden), dtype)
    gen = torch.Generator().manual_seed(7)
    residual = torch.randn(rows, hidden, generator=gen).to(DEVICE, dtype)
    want_out, want_h = rms_norm_ref(x, weight, EPS, residual.clone())
    atol, rtol = TOLERANCES[dtype]
    out, h = rms_norm(x, weight, EPS, residual)
    assert h is residual
    # x + residual rounded once to the dtype: exact in float32; in bfloat16 the
    # interpreter truncates where torch (and the GPU) round to nearest, one ulp
    exact = dtype == torch.float32
    torch.testing.assert_close(residual, want_h, atol=0, rtol=0 if exact else 2**-7)
    torch.testing.assert_close(out, want_out, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_per_head_on_strided_view(dtype: torch.dtype) -> None:
    # q of a fused [tokens, (heads + 2 * kv_heads) * head_dim] output: a strided 3-D view
    tokens, heads, kv_heads, head_dim = 5, 4, 2, 48
    qkv, weight = _inputs((tokens, (heads + 2 * kv_heads) * head_dim), dtype)
    weight = weight[:head_dim].contiguous()
    q = qkv.split([heads * head_dim, 2 * kv_heads * head_dim], dim=-1)[0].view(
        tokens, heads, head_dim
    )
    assert not q.is_contiguous()
    atol, rtol = TOLERANCES[dtype]
    out = rms_norm(q, weight, EPS)
    assert out.shape == q.shape
    torch.testing.assert_close(out, rms_norm_ref(q, weight, EPS), atol=atol, rtol=rtol)


def test_rms_norm_ref_matches_the_model_ops() -> None:
    x, weight = _inputs((3, 96), torch.bfloat16)
    residual = torch.randn(3, 96).to(DEVICE, torch.bfloat16)
    want = TorchOps().rms_norm(x, weight, EPS)
    torch.testing.assert_close(rms_norm_ref(x, weight, EPS), want, atol=0, rtol=0)
    want_pair = TorchOps().add_rms_norm(x, residual, weight, EPS)
    torch.testing.assert_close(rms_norm_ref(x, weight, EPS, residual), want_pair, atol=0, rtol=0)


def test_rms_norm_rows_are_batch_invariant() -> None:
    x, weight = _inputs((17, 100), torch.float32)
    whole = rms_norm(x, weight, EPS)
    torch.testing.assert_close(rms_norm(x[5:6], weight, EPS), whole[5:6], atol=0, rtol=0)


def test_rms_norm_rejects_bad_input() -> None:
    x, weight = _inputs((3, 64), torch.float32)
    with pytest.raises(AssertionError, match=r"weight\.shape"):
        rms_norm(x, weight[:32], EPS)
    with pytest.raises(AssertionError, match=r"x\.dtype"):
        rms_norm(x.double(), weight.double(), EPS)
    with pytest.raises(AssertionError, match="contiguous"):
        rms_norm(x.t(), weight[:3], EPS)

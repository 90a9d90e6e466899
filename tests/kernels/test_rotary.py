"""kernels.rotary against its torch reference (and the model's TorchOps.rope)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kernels import device_type
from kernels.rotary import apply_rotary_, apply_rotary_ref
from rt.gpu.models.ops import TorchOps
from rt.gpu.models.rope import rope_inv_freq

# float32: cos/sin of the same float32 angles (up to 4000 rad) from two libms.
# bfloat16: cos, sin, each product and the sum are rounded to bfloat16 (ulp 2**-8
# relative, and the interpreter truncates where torch rounds): a few ulps of
# values of magnitude ~3.
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}
DEVICE = torch.device(device_type())
SCALINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
}


def _fused_qkv(
    tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qkv, q, k, positions): q and k are strided views into qkv, as the model splits it."""
    gen = torch.Generator().manual_seed(tokens * 1000 + heads * 10 + kv_heads + head_dim)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(DEVICE, dtype)
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim)
    positions = torch.randint(0, 4001, (tokens,), generator=gen, dtype=torch.int64)
    positions[0] = 4000
    return qkv, q, k, positions.to(DEVICE)


SHAPES = [(1, 4, 2, 64), (5, 4, 1, 32), (19, 4, 2, 48)]  # tokens, heads, kv_heads, head_dim
# every shape with every scaling in float32; in bfloat16 each shape with one scaling
# (the interpreter runs a program per token: the full cross would take ~10 s)
CASES = [(*shape, torch.float32, scaling) for shape in SHAPES for scaling in SCALINGS] + [
    (*shape, torch.bfloat16, scaling) for shape, scaling in zip(SHAPES, SCALINGS, strict=True)
]


@pytest.mark.parametrize(
    ("tokens", "heads", "kv_heads", "head_dim", "dtype", "scaling"),
    CASES,
    ids=["-".join(str(v).removeprefix("torch.") for v in case) for case in CASES],
)
def test_apply_rotary_in_place_through_fused_qkv_views(
    tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, scaling: str
) -> None:
    qkv, q, k, positions = _fused_qkv(tokens, heads, kv_heads, head_dim, dtype)
    # (one token's view gets compact strides; the row stride only matters for several)
    assert tokens == 1 or q.stride() == ((heads + 2 * kv_heads) * head_dim, head_dim, 1)
    inv_freq = rope_inv_freq(head_dim, 10000.0, SCALINGS[scaling]).to(DEVICE)
    want_q, want_k = apply_rotary_ref(q, k, positions, inv_freq)
    v_before = qkv[:, (heads + kv_heads) * head_dim :].clone()
    atol, rtol = TOLERANCES[dtype]
    assert apply_rotary_(q, k, positions, inv_freq) is None  # type: ignore[func-returns-value]
    torch.testing.assert_close(q, want_q, atol=atol, rtol=rtol)
    torch.testing.assert_close(k, want_k, atol=atol, rtol=rtol)
    # the writes landed in qkv itself, and v is untouched
    torch.testing.assert_close(qkv[:, : heads * head_dim].view_as(q), want_q, atol=atol, rtol=rtol)
    torch.testing.assert_close(qkv[:, (heads + kv_heads) * head_dim :], v_before, atol=0, rtol=0)


def test_apply_rotary_ref_matches_the_model_ops() -> None:
    _, q, k, positions = _fused_qkv(5, 4, 2, 64, torch.bfloat16)
    inv_freq = rope_inv_freq(64, 500000.0, SCALINGS["llama3"]).to(DEVICE)
    ops = TorchOps()
    ops.begin(positions, inv_freq, torch.bfloat16)
    want = ops.rope(q, k)
    torch.testing.assert_close(apply_rotary_ref(q, k, positions, inv_freq), want, atol=0, rtol=0)


def test_apply_rotary_rejects_bad_input() -> None:
    _, q, k, positions = _fused_qkv(3, 4, 2, 32, torch.float32)
    inv_freq = rope_inv_freq(32, 10000.0, {}).to(DEVICE)
    with pytest.raises(AssertionError, match="int64"):
        apply_rotary_(q, k, positions.int(), inv_freq)
    with pytest.raises(AssertionError, match="inv_freq"):
        apply_rotary_(q, k, positions, inv_freq[:8])
    with pytest.raises(AssertionError, match=r"k\.dtype"):
        apply_rotary_(q, k.to(torch.bfloat16), positions, inv_freq)
    with pytest.raises(AssertionError, match="contiguous"):
        apply_rotary_(q, torch.randn(3, 2, 64, device=DEVICE)[..., ::2], positions, inv_freq)

"""The model's pointwise and per-row operations, in torch or through rt's Triton kernels.

:class:`TorchOps` is the reference. :class:`TritonOps` runs RMSNorm with the
residual add fused, rotary embedding in place and SiLU-and-multiply through
``kernels/`` (under Triton's interpreter on the CPU). With ``deterministic``
either one computes linear layers batch-invariantly (:func:`batch_invariant_linear`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Rows per matmul in deterministic mode. A GEMM's reduction order can change with
# its row count (a single row takes a GEMV path on the CPU); a fixed, padded row
# count makes each row's result independent of what else is in the batch.
INVARIANT_ROWS = {"cpu": 16, "cuda": 64}


def batch_invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``F.linear`` over fixed-size, zero-padded blocks of rows: row i's result does
    not depend on the other rows nor on how many there are."""
    rows = INVARIANT_ROWS.get(x.device.type, 64)
    n = x.shape[0]
    padded = -(-n // rows) * rows
    if padded != n:
        x = torch.cat((x, x.new_zeros(padded - n, x.shape[1])))
    out = torch.cat([F.linear(block, weight, bias) for block in x.split(rows)])
    return out[:n]


class TorchOps:
    """The reference: what transformers computes, in torch."""

    sampling_kernel = False  # the sampler's draw in torch (rt/gpu/sampler.py)

    def __init__(self, deterministic: bool = False) -> None:
        self.deterministic = deterministic
        self._cos = self._sin = torch.empty(0)

    def linear(self, x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
        if self.deterministic:
            return batch_invariant_linear(x, layer.weight, layer.bias)
        return layer(x)

    def begin(self, positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> None:
        """Per forward pass: the rotary tables of these positions."""
        # [num_tokens, head_dim], the two halves repeated as in transformers' rotate_half layout
        freqs = positions.float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self._cos, self._sin = emb.cos().to(dtype), emb.sin().to(dtype)

    def rope(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _rotate(q, self._cos, self._sin), _rotate(k, self._cos, self._sin)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x32.to(x.dtype)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual); no residual yet: (norm(x), x)."""
        if residual is not None:
            x = x + residual
        return self.rms_norm(x, weight, eps), x

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [num_tokens, num_heads, head_dim]; cos/sin: [num_tokens, head_dim]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class TritonOps(TorchOps):
    """The same operations through ``kernels/`` (linear layers stay torch matmuls)."""

    sampling_kernel = True  # the sampler's draw through kernels/sampling.py

    def __init__(self, deterministic: bool = False) -> None:
        super().__init__(deterministic)
        from kernels import rmsnorm, rotary, silu_mul

        self._rmsnorm, self._rotary, self._silu_mul = rmsnorm, rotary, silu_mul
        self._positions = self._inv_freq = torch.empty(0)

    def begin(self, positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> None:
        self._positions, self._inv_freq = positions, inv_freq

    def rope(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._rotary.apply_rotary_(q, k, self._positions, self._inv_freq)
        return q, k

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out = self._rmsnorm.rms_norm(x, weight, eps)
        assert isinstance(out, torch.Tensor)
        return out

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self.rms_norm(x, weight, eps), x
        out = self._rmsnorm.rms_norm(x, weight, eps, residual)
        assert isinstance(out, tuple)
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._silu_mul.silu_and_mul(gate_up)


def create_ops(backend: str, deterministic: bool) -> TorchOps:
    """The ops that go with an attention backend: its kernels for ``triton``."""
    return TritonOps(deterministic) if backend == "triton" else TorchOps(deterministic)

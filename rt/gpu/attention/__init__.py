"""Attention backends behind one interface, chosen by name.

``torch`` is the reference (CPU and CUDA): it gathers each request's KV and
runs SDPA. ``triton`` reads the paged pool through rt's kernels (interpreted on
the CPU) and is the one with a deterministic mode. ``flashinfer`` runs
flashinfer's paged wrappers (CUDA only). Each is imported only when chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from rt.errors import ConfigError
from rt.gpu.forward_batch import ForwardBatch
from rt.gpu.kv_pool import KVPool


class AttentionBackend(Protocol):
    """Stores a layer's new K/V in the paged pool and attends over each request's slots."""

    def prepare(self, batch: ForwardBatch) -> None:
        """Build the per-step metadata shared by every layer."""

    def forward(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim] → [num_tokens, num_heads * head_dim]."""
        ...


BackendFactory = Callable[[KVPool, torch.Tensor, Sequence[int | None], bool], AttentionBackend]


def _torch_factory(
    pool: KVPool, req_to_token: torch.Tensor, windows: Sequence[int | None], deterministic: bool
) -> AttentionBackend:
    from rt.gpu.attention.torch_backend import TorchAttention

    if deterministic:
        raise ConfigError("attention_backend='torch' has no deterministic mode; use 'triton'")
    return TorchAttention(pool, req_to_token, windows)


def _triton_factory(
    pool: KVPool, req_to_token: torch.Tensor, windows: Sequence[int | None], deterministic: bool
) -> AttentionBackend:
    from rt.gpu.attention.triton_backend import TritonAttention

    return TritonAttention(pool, req_to_token, windows, deterministic)


def _flashinfer_factory(
    pool: KVPool, req_to_token: torch.Tensor, windows: Sequence[int | None], deterministic: bool
) -> AttentionBackend:
    from rt.gpu.attention.flashinfer_backend import FlashInferAttention

    if deterministic:
        raise ConfigError("attention_backend='flashinfer' has no deterministic mode; use 'triton'")
    return FlashInferAttention(pool, req_to_token, windows)


ATTENTION_BACKENDS: dict[str, BackendFactory] = {
    "torch": _torch_factory,
    "triton": _triton_factory,
    "flashinfer": _flashinfer_factory,
}
# backends that read the pool as pages of [page_size, kv_heads, head_dim] (KVPool.pages)
SLOTS_MAJOR_BACKENDS = frozenset({"flashinfer"})


def create_attention_backend(
    name: str,
    pool: KVPool,
    req_to_token: torch.Tensor,
    windows: Sequence[int | None],
    deterministic: bool = False,
) -> AttentionBackend:
    """Build the backend registered under ``name``."""
    factory = ATTENTION_BACKENDS.get(name)
    if factory is None:
        raise ConfigError(
            f"attention_backend={name!r} is not available; expected one of {sorted(ATTENTION_BACKENDS)}"
        )
    return factory(pool, req_to_token, windows, deterministic)

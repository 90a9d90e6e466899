"""Attention backends behind one interface, chosen by name.

``torch`` is the reference (CPU and CUDA). ``triton`` and ``flashinfer`` are
seams for later: registering a factory under their name is all it takes.
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


BackendFactory = Callable[[KVPool, torch.Tensor, Sequence[int | None]], AttentionBackend]


def _torch_factory(
    pool: KVPool, req_to_token: torch.Tensor, windows: Sequence[int | None]
) -> AttentionBackend:
    from rt.gpu.attention.torch_backend import TorchAttention

    return TorchAttention(pool, req_to_token, windows)


ATTENTION_BACKENDS: dict[str, BackendFactory] = {"torch": _torch_factory}


def create_attention_backend(
    name: str, pool: KVPool, req_to_token: torch.Tensor, windows: Sequence[int | None]
) -> AttentionBackend:
    """Build the backend registered under ``name``."""
    factory = ATTENTION_BACKENDS.get(name)
    if factory is None:
        raise ConfigError(
            f"attention_backend={name!r} is not available; expected one of {sorted(ATTENTION_BACKENDS)}"
        )
    return factory(pool, req_to_token, windows)

"""Decode's memory-bandwidth bound, and the timing it is measured with (tools/gpu_bench.py).

A decode step reads every weight once and each request's KV: the device's
copy bandwidth over those bytes bounds its tokens per second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rt.gpu import ModelConfig


@dataclass(frozen=True)
class Roofline:
    """Decode's memory-bandwidth bound: each step reads every weight and the batch's KV."""

    bandwidth: float  # bytes/s, read + written by a device copy
    weight_bytes: int  # read once per decode step
    kv_bytes_per_token: int

    def limit(self, batch: int, mean_context: float) -> float:
        step_bytes = self.weight_bytes + batch * mean_context * self.kv_bytes_per_token
        return batch * self.bandwidth / step_bytes


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], Any]) -> float:
    """Seconds ``fn`` takes, the device drained before and after."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def copy_bandwidth(device: torch.device, mib: int, repeats: int = 10) -> float:
    """Best bytes/s (read + written) of copying a ``mib`` MiB tensor on ``device``."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    src.fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    best = min(timed(device, lambda: dst.copy_(src)) for _ in range(repeats))
    return 2 * src.numel() / best


def weight_bytes_read(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Weight bytes one decode step reads: all parameters, the embedding matrix once
    (as the lm_head; the lookup reads one row per token, left out)."""
    params = cfg.num_params
    if not cfg.tie_word_embeddings:
        params -= cfg.vocab_size * cfg.hidden_size
    return params * torch.empty(0, dtype=dtype).element_size()

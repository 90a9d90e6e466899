"""Paged attention with flashinfer's batch wrappers over a slots-major KV pool.

Per step, ``prepare`` turns each request's row of the request→token table into
flashinfer's page table (``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len``);
per layer, ``forward`` writes the new K/V into the pool and runs the wrapper
planned for that layer's sliding window on :meth:`KVPool.pages` (the "NHD"
layout). Written against the flashinfer-python 0.7 wrapper API.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch

from rt.errors import ConfigError
from rt.gpu.forward_batch import ForwardBatch
from rt.gpu.kv_pool import KVPool

WORKSPACE_BYTES = 128 * 1024 * 1024  # flashinfer's recommended float workspace
_NEEDS = (
    "attention_backend='flashinfer' needs CUDA and the flashinfer-python package "
    "(pip install 'rt[gpu]')"
)


def window_left(window: int | None) -> int:
    """flashinfer's ``window_left`` for a sliding window of ``window`` keys.

    rt (like HF) keeps ``kv_pos > q_pos - window``: ``window`` keys counting the
    query's own. flashinfer keeps ``kv_idx + qo_len + window_left >= kv_len + qo_idx``
    (include/flashinfer/attention/variants.cuh), i.e. ``kv_pos >= q_pos - window_left``:
    ``window_left + 1`` keys. -1 turns the window off.
    """
    return -1 if window is None else window - 1


def _import_flashinfer(pool: KVPool) -> Any:
    if pool.k.device.type != "cuda":
        raise ConfigError(f"{_NEEDS}; the KV pool is on {pool.k.device}")
    try:
        import flashinfer
    except (ImportError, OSError) as err:
        raise ConfigError(f"{_NEEDS}; importing flashinfer failed: {err}") from err
    return flashinfer


def page_table(
    req_to_token: torch.Tensor, req_rows: torch.Tensor, seq_lens: Sequence[int], page_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """flashinfer's CSR page table for requests ``req_rows`` holding ``seq_lens`` tokens.

    Returns ``kv_indptr`` [batch + 1] and ``kv_last_page_len`` [batch] on the host
    (built from Python ints, where ``plan`` wants them: planning needs no
    device→host sync) and ``kv_indices`` [kv_indptr[-1]] on ``req_to_token``'s
    device, all int32. Page ``j`` of a request holds its positions
    ``[j * page_size, (j + 1) * page_size)`` in order (the engine hands out whole
    pages), so its id is the page of the slot at position ``j * page_size``.
    """
    device = req_to_token.device
    num_pages = [(n + page_size - 1) // page_size for n in seq_lens]
    kv_indptr = torch.tensor([0, *itertools.accumulate(num_pages)], dtype=torch.int32)
    last_page_len = torch.tensor(
        [n - (p - 1) * page_size for n, p in zip(seq_lens, num_pages, strict=True)],
        dtype=torch.int32,
    )
    total = int(kv_indptr[-1])
    counts = torch.tensor(num_pages, device=device)
    page_req = torch.repeat_interleave(req_rows.to(device), counts, output_size=total)
    page_start = torch.repeat_interleave(kv_indptr[:-1].to(device), counts, output_size=total)
    page_in_req = torch.arange(total, device=device) - page_start
    first_slots = req_to_token[page_req, page_in_req * page_size]
    kv_indices = (first_slots // page_size).to(torch.int32)
    return kv_indptr, kv_indices, last_page_len


class FlashInferAttention:
    """One decode and one prefill wrapper per distinct sliding window, sharing one workspace.

    ``plan`` needs the query head count and dtype, which the backend first sees
    in ``forward``; so ``prepare`` builds the page table and the first layer of
    each window in a step plans that window's wrapper, once per step.
    """

    def __init__(
        self, pool: KVPool, req_to_token: torch.Tensor, windows: Sequence[int | None]
    ) -> None:
        if not pool.slots_major:
            raise ConfigError(
                "attention_backend='flashinfer' needs a slots_major KV pool "
                "(KVPool(..., slots_major=True)): its kernels read K/V as pages "
                "[num_pages, page_size, num_kv_heads, head_dim]; got a heads-major pool"
            )
        flashinfer = _import_flashinfer(pool)
        self.pool = pool
        self.req_to_token = req_to_token
        self.windows = list(windows)
        device = pool.k.device
        # shared by every wrapper: it holds split-KV partials only for the duration of one
        # run (each wrapper keeps its plan in its own int workspace), and runs are serial
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        distinct = list(dict.fromkeys(self.windows))
        self._prefill = {
            w: flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
            for w in distinct
        }
        # decode wrappers are built on the first decode step: whether tensor cores pay off
        # depends on the GQA group size, i.e. on the query head count seen in forward
        self._decode: dict[int | None, Any] = {}
        self._flashinfer = flashinfer
        self._is_decode = False
        self._out_loc = torch.empty(0, dtype=torch.int64, device=device)
        self._meta: tuple[torch.Tensor, ...] = ()
        self._step_wrappers: dict[int | None, Any] = {}  # planned for this step, by window

    def prepare(self, batch: ForwardBatch) -> None:
        kv_indptr, kv_indices, last_page_len = page_table(
            self.req_to_token, batch.req_rows, batch.seq_lens, self.pool.page_size
        )
        qo_indptr = torch.tensor([0, *itertools.accumulate(batch.extend_lens)], dtype=torch.int32)
        self._is_decode = batch.is_decode
        self._meta = (qo_indptr, kv_indptr, kv_indices, last_page_len)
        self._out_loc = batch.out_cache_loc
        self._step_wrappers = {}

    def _plan(self, window: int | None, q: torch.Tensor) -> Any:
        assert self._meta, "prepare() must run before forward()"
        qo_indptr, kv_indptr, kv_indices, last_page_len = self._meta
        _, num_kv_heads, _, head_dim = self.pool.k.shape
        num_qo_heads = q.shape[1]
        common = dict(
            window_left=window_left(window),
            q_data_type=q.dtype,
            kv_data_type=self.pool.k.dtype,
            sm_scale=1.0 / math.sqrt(head_dim),
        )
        args = (num_qo_heads, num_kv_heads, head_dim, self.pool.page_size)
        if self._is_decode:
            wrapper = self._decode.get(window)
            if wrapper is None:
                wrapper = self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    self._workspace, "NHD", use_tensor_cores=num_qo_heads // num_kv_heads >= 4
                )
                self._decode[window] = wrapper
            wrapper.plan(kv_indptr, kv_indices, last_page_len, *args, **common)
        else:
            wrapper = self._prefill[window]
            # causal is bottom-right aligned: query i of a request sits at kv position
            # kv_len - qo_len + i = prefix_len + i, as in the reference backend
            wrapper.plan(
                qo_indptr, kv_indptr, kv_indices, last_page_len, *args, causal=True, **common
            )
        self._step_wrappers[window] = wrapper
        return wrapper

    def forward(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        # [num_slots, num_kv_heads, head_dim] views of the slots-major buffers
        self.pool.k[layer_id].transpose(0, 1).index_copy_(0, self._out_loc, k)
        self.pool.v[layer_id].transpose(0, 1).index_copy_(0, self._out_loc, v)
        window = self.windows[layer_id]
        wrapper = self._step_wrappers.get(window)
        if wrapper is None:
            wrapper = self._plan(window, q)
        out = wrapper.run(q.contiguous(), self.pool.pages(layer_id))
        return out.reshape(q.shape[0], -1)  # [num_tokens, num_heads * head_dim]

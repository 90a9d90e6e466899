"""Attention through rt's Triton kernels, straight from the paged pool (no gather).

A step stores its new K/V by slot, then attends: a decode batch through the
split-K decode kernel, anything else through the extend kernel (new tokens
against their cached prefix and themselves). In deterministic mode every step
takes the extend kernel, whose key tiles start at position 0 in a fixed order,
so a token's attention is the same whether its prefix was prefilled or decoded
and whatever else is in the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from rt.errors import ConfigError
from rt.gpu.forward_batch import ForwardBatch
from rt.gpu.kv_pool import KVPool

# keys per split of the decode kernel: fixed, so a request's reduction order does
# not depend on the longest request in its batch
DECODE_SPLIT = 256


class TritonAttention:
    def __init__(
        self,
        pool: KVPool,
        req_to_token: torch.Tensor,
        windows: Sequence[int | None],
        deterministic: bool = False,
    ) -> None:
        try:
            from kernels import decode_attention, extend_attention, kv_store, why_not_on
        except ImportError as err:  # triton missing
            raise ConfigError(
                f"attention_backend='triton' needs the triton package (pip install 'rt[gpu]'): {err}"
            ) from err
        if (why := why_not_on(req_to_token.device)) is not None:
            raise ConfigError(f"attention_backend='triton': {why}")
        self._decode, self._extend, self._store = decode_attention, extend_attention, kv_store
        self.pool = pool
        self.req_to_token = req_to_token
        self.windows = list(windows)
        self.deterministic = deterministic
        self._batch: ForwardBatch | None = None
        self._meta: dict[str, torch.Tensor] = {}
        self._num_splits = 1
        self._max_extend = 1
        self._decode_step = False

    def prepare(self, batch: ForwardBatch) -> None:
        device = self.req_to_token.device
        self._batch = batch
        self._decode_step = batch.is_decode and not self.deterministic
        extend_lens = torch.tensor(batch.extend_lens, dtype=torch.int64, device=device)
        self._meta = {
            "req_rows": batch.req_rows.to(device),
            "seq_lens": torch.tensor(batch.seq_lens, dtype=torch.int64, device=device),
            "prefix_lens": torch.tensor(batch.prefix_lens, dtype=torch.int64, device=device),
            "extend_lens": extend_lens,
            "q_starts": torch.cumsum(extend_lens, 0) - extend_lens,
            "out_loc": batch.out_cache_loc.to(device),
        }
        self._num_splits = -(-max(batch.seq_lens) // DECODE_SPLIT)
        self._max_extend = max(batch.extend_lens)

    def prepare_static_decode(
        self,
        req_rows: torch.Tensor,
        seq_lens: torch.Tensor,
        out_loc: torch.Tensor,
        max_context: int,
    ) -> None:
        """A decode step whose metadata is already on the device: a CUDA graph's static
        buffers (rt/gpu/cuda_graph.py), [bs] int64 each.

        Nothing runs here, and the decode kernel's grid depends on the batch size
        alone: its split count covers ``max_context`` keys, every request's length at
        most, instead of this step's longest. The split size stays DECODE_SPLIT, so a
        request's reduction order, and its output, are the eager step's: splits past
        its length are empty, and the merge skips them. A row with seq_len 0 attends to
        nothing (zeros) and its K/V go to ``out_loc``. The next :meth:`prepare` ends it.
        """
        assert not self.deterministic, "deterministic mode runs every step as an extend"
        self._batch = None
        self._decode_step = True
        self._meta = {"req_rows": req_rows, "seq_lens": seq_lens, "out_loc": out_loc}
        self._num_splits = -(-max_context // DECODE_SPLIT)
        self._max_extend = 1

    def forward(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        meta = self._meta
        k_buf, v_buf = self.pool.k[layer_id], self.pool.v[layer_id]  # [kv_heads, slots, head_dim]
        self._store.store_kv(k_buf, v_buf, k, v, meta["out_loc"])
        num_tokens, num_heads, head_dim = q.shape
        scale = 1.0 / math.sqrt(head_dim)
        window = self.windows[layer_id]
        if self._decode_step:
            out = self._decode.decode_attention(
                q,
                k_buf,
                v_buf,
                self.req_to_token,
                meta["req_rows"],
                meta["seq_lens"],
                scale,
                window,
                split_size=DECODE_SPLIT,
                num_splits=self._num_splits,
            )
        else:
            out = self._extend.extend_attention(
                q,
                k_buf,
                v_buf,
                self.req_to_token,
                meta["req_rows"],
                meta["prefix_lens"],
                meta["extend_lens"],
                scale,
                window,
                q_starts=meta["q_starts"],
                max_extend_len=self._max_extend,
            )
        return out.reshape(num_tokens, num_heads * head_dim)

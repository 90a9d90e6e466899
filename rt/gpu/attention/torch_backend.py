"""Reference attention: gather each request's KV by slot index, pad, and run SDPA."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from rt.gpu.forward_batch import ForwardBatch
from rt.gpu.kv_pool import KVPool


class TorchAttention:
    """Vectorised over the batch: one padded SDPA call per layer, no per-request loop."""

    def __init__(
        self, pool: KVPool, req_to_token: torch.Tensor, windows: Sequence[int | None]
    ) -> None:
        self.pool = pool
        self.req_to_token = req_to_token
        self.windows = list(windows)
        self._out_loc = torch.empty(0, dtype=torch.int64)
        self._kv_flat = torch.empty(0, dtype=torch.int64)
        self._masks: dict[int | None, torch.Tensor] = {}
        self._pad_index: torch.Tensor | None = None
        self._shape = (0, 0)

    def prepare(self, batch: ForwardBatch) -> None:
        device = self.req_to_token.device
        seq_lens = torch.tensor(batch.seq_lens, device=device)
        prefix_lens = torch.tensor(batch.prefix_lens, device=device)
        extend_lens = torch.tensor(batch.extend_lens, device=device)
        bs, max_kv, max_q = batch.batch_size, max(batch.seq_lens), max(batch.extend_lens)
        self._out_loc = batch.out_cache_loc
        self._kv_flat = self.req_to_token[batch.req_rows, :max_kv].flatten()  # [bs * max_kv]
        q_off = torch.arange(max_q, device=device)
        q_pos = prefix_lens[:, None] + q_off[None, :]  # [bs, max_q]
        kv_pos = torch.arange(max_kv, device=device)[None, None, :]  # [1, 1, max_kv]
        valid_q = (q_off[None, :] < extend_lens[:, None])[:, :, None]
        base = (kv_pos <= q_pos[:, :, None]) & (kv_pos < seq_lens[:, None, None])
        self._masks = {}
        for window in set(self.windows):
            mask = base if window is None else base & (kv_pos > q_pos[:, :, None] - window)
            # padded query rows attend to slot 0 only so softmax never sees an all-masked row
            mask = torch.where(valid_q, mask, kv_pos == 0)
            self._masks[window] = mask[:, None, :, :]  # [bs, 1, max_q, max_kv]
        self._shape = (bs, max_q)
        if max_q == 1:
            self._pad_index = None
        else:
            starts = torch.cumsum(extend_lens, 0) - extend_lens
            token_req = torch.repeat_interleave(torch.arange(bs, device=device), extend_lens)
            token_off = torch.arange(int(extend_lens.sum()), device=device) - starts[token_req]
            self._pad_index = token_req * max_q + token_off  # flat token → row of [bs * max_q]

    def forward(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        k_buf, v_buf = self.pool.k[layer_id], self.pool.v[layer_id]  # [kv_heads, slots, head_dim]
        # index_copy_/index_select: several times faster on CPU than advanced indexing
        k_buf.index_copy_(1, self._out_loc, k.transpose(0, 1))
        v_buf.index_copy_(1, self._out_loc, v.transpose(0, 1))
        bs, max_q = self._shape
        _, num_heads, head_dim = q.shape
        kv_shape = (k_buf.shape[0], bs, -1, head_dim)
        keys = (
            k_buf.index_select(1, self._kv_flat).view(kv_shape).transpose(0, 1)
        )  # [bs, kv_heads, max_kv, head_dim]
        values = v_buf.index_select(1, self._kv_flat).view(kv_shape).transpose(0, 1)
        if self._pad_index is None:
            q_pad = q.view(bs, 1, num_heads, head_dim)
        else:
            q_pad = q.new_zeros(bs * max_q, num_heads, head_dim)
            q_pad[self._pad_index] = q
            q_pad = q_pad.view(bs, max_q, num_heads, head_dim)
        out = F.scaled_dot_product_attention(
            q_pad.transpose(1, 2),
            keys,
            values,
            attn_mask=self._masks[self.windows[layer_id]],
            enable_gqa=num_heads != keys.shape[1],
        )  # [bs, num_heads, max_q, head_dim]
        out = out.transpose(1, 2).reshape(bs * max_q, num_heads * head_dim)
        if self._pad_index is not None:
            out = out[self._pad_index]
        return out

"""Turn scheduled requests into a ForwardBatch, run the model, hand back logits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rt.gpu.attention import AttentionBackend
from rt.gpu.forward_batch import ForwardBatch
from rt.gpu.models.llama import LlamaForCausalLM
from rt.gpu.models.ops import TorchOps
from rt.gpu.request import Req

if TYPE_CHECKING:
    from rt.gpu.compiled_decode import CompiledDecode
    from rt.gpu.cuda_graph import DecodeGraphs


@dataclass
class ScheduledReq:
    """``req`` computes positions ``req.kv_len .. req.kv_len + extend_len`` into ``out_cache_loc``."""

    req: Req
    extend_len: int
    out_cache_loc: torch.Tensor

    @property
    def samples(self) -> bool:
        return self.req.kv_len + self.extend_len == self.req.seq_len


class NullModel:
    """No forward pass: logits that pick a fixed token per position (never a stop id).

    The chosen token's logit is so far above the rest that sampling picks it too at
    any ordinary temperature (at 5, every other token of a 32k vocabulary together has
    a chance under 1e-4): with a logit of 1 against a flat vocabulary, a temperature-1
    draw picked an end-of-sequence token now and then, and a request ended early.
    """

    PEAK = 100.0

    def __init__(self, vocab_size: int, avoid_ids: Sequence[int]) -> None:
        self.vocab_size = vocab_size
        self.avoid = set(avoid_ids)

    def token_at(self, position: int) -> int:
        tok = (position * 7919 + 13) % self.vocab_size
        while tok in self.avoid:
            tok = (tok + 1) % self.vocab_size
        return tok

    def __call__(self, batch: ForwardBatch, attn: AttentionBackend | None) -> torch.Tensor:
        positions = batch.positions[batch.sample_indices].tolist()
        logits = torch.zeros(len(positions), self.vocab_size, device=batch.input_ids.device)
        ids = torch.tensor([self.token_at(p + 1) for p in positions], device=logits.device)
        return logits.scatter_(1, ids[:, None], self.PEAK)


class ModelRunner:
    """Owns the model and its attention backend; knows nothing of scheduling."""

    def __init__(
        self,
        model: LlamaForCausalLM | NullModel,
        attn: AttentionBackend | None,
        device: torch.device,
        ops: TorchOps | None = None,
    ) -> None:
        self.model = model
        self.attn = attn
        self.device = device
        self.ops = ops or TorchOps()
        # captured decode passes (CUDA, triton): replayed for every decode batch they fit
        self.graphs: DecodeGraphs | None = None
        self.graph_replays = 0
        # decode passes compiled by torch.compile (the torch backend): run for every
        # decode batch they fit
        self.compiled: CompiledDecode | None = None

    def build_batch(
        self,
        items: Sequence[ScheduledReq],
        req_rows_device: torch.device,
        pending_tokens: torch.Tensor | None = None,
    ) -> ForwardBatch:
        """The forward pass of ``items``. A token not read back yet (overlap scheduling)
        is ``-(i + 1)`` in its request's outputs: it is taken from ``pending_tokens[i]``,
        on the device, where the previous step drew it."""
        input_ids: list[int] = []
        positions: list[int] = []
        sample_indices: list[int] = []
        sampled_rows: list[int] = []
        spans: list[tuple[int, int, int, int]] = []
        total = 0
        for b, item in enumerate(items):
            req, start, n = item.req, item.req.kv_len, item.extend_len
            if n == 1 and req.decoding:
                input_ids.append(req.output_ids[-1])
            else:
                input_ids.extend(req.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            if req.computing_prompt_logprobs:
                # position p's logits give the logprob of prompt token p + 1
                lo = max(start, len(req.prompt_logprobs))
                hi = min(start + n, len(req.input_ids) - 1)
                if hi > lo:
                    spans.append((b, len(sample_indices), hi - lo, lo))
                    sample_indices.extend(range(total + lo - start, total + hi - start))
            total += n
            if item.samples:
                sampled_rows.append(len(sample_indices))
                sample_indices.append(total - 1)
        dev = self.device
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        if pending_tokens is not None and min(input_ids) < 0:
            ids = torch.where(ids < 0, pending_tokens[(-ids - 1).clamp(min=0)], ids)
        return ForwardBatch(
            input_ids=ids,
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            out_cache_loc=torch.cat([i.out_cache_loc for i in items]).to(dev),
            req_rows=torch.tensor(
                [i.req.row for i in items], dtype=torch.int64, device=req_rows_device
            ),
            prefix_lens=[i.req.kv_len for i in items],
            extend_lens=[i.extend_len for i in items],
            sample_indices=torch.tensor(sample_indices, dtype=torch.int64, device=dev),
            sampled_rows=torch.tensor(sampled_rows, dtype=torch.int64, device=dev)
            if spans
            else None,
            prompt_spans=spans,
        )

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [num_sampled, vocab] float32."""
        if isinstance(self.model, NullModel):
            return self.model(batch, self.attn)
        if self.graphs is not None and self.graphs.can_run(batch):
            self.graph_replays += 1
            return self.graphs.run(batch)
        if self.compiled is not None and self.compiled.can_run(batch):
            return self.compiled.run(batch)
        assert self.attn is not None
        return self.model(batch, self.attn, self.ops)

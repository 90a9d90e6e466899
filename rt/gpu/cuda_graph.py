"""CUDA graphs of decode steps: one captured forward pass per batch size of a ladder.

At small batch sizes a decode step costs the CPU more, launching a few kernels per
layer, than it costs the GPU; a graph replays the whole pass as one launch. A graph
fixes its kernels' shapes and addresses, so the graphs read static buffers sized for
the largest batch: a step copies its batch in, pads it to the next captured size and
replays that size's graph.

A padding row is token 0 at position 0 with seq_len 0: it stores its K/V in slot 0,
the pool's reserved dummy slot (KVPool), attends to nothing (zeros), and its logits
are dropped. Attention reads its metadata from the same buffers
(:meth:`TritonAttention.prepare_static_decode`), so only the triton backend outside
deterministic mode can be captured.

Capture follows torch's recipe (torch.cuda.graphs): each size is warmed up on a side
stream, which compiles its kernels, then captured; largest first, into one memory
pool, so the smaller graphs reuse the largest one's memory.
"""

from __future__ import annotations

from bisect import bisect_left

import torch

from rt.errors import ConfigError
from rt.gpu.attention.triton_backend import TritonAttention
from rt.gpu.forward_batch import ForwardBatch
from rt.gpu.models.llama import LlamaForCausalLM
from rt.gpu.models.ops import TorchOps

# the longest sequence a graph serves: the decode kernel's split count covers this many
# keys for every request, so longer contexts would make short steps pay for empty splits
GRAPH_MAX_CONTEXT = 8192


def batch_ladder(max_bs: int) -> list[int]:
    """The captured batch sizes: 1, 2, 4, 8, then multiples of 8, up to and with ``max_bs``."""
    if max_bs < 1:
        raise ConfigError(f"the largest graph batch size must be at least 1, got {max_bs}")
    return [s for s in (1, 2, 4) if s < max_bs] + list(range(8, max_bs, 8)) + [max_bs]


class DecodeInputs:
    """A decode step's inputs in static buffers of ``max_bs`` rows: the step's batch in
    the first rows, the rest up to the size run padding (zeros)."""

    def __init__(self, max_bs: int, device: torch.device) -> None:
        self.max_bs = max_bs
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros_like(self.input_ids)
        self.out_loc = torch.zeros_like(self.input_ids)
        self.req_rows = torch.zeros_like(self.input_ids)

    def fits(self, batch: ForwardBatch) -> bool:
        """Whether ``batch`` is a decode step of at most ``max_bs`` requests, every row
        sampled and nothing else asked."""
        bs = batch.batch_size
        return (
            0 < bs <= self.max_bs
            and batch.is_decode
            # a decode-shaped prefill chunk (one token left, not the last) samples nothing
            and batch.sample_indices.shape[0] == bs
            and batch.sampled_rows is None
            and not batch.prompt_spans
        )

    def load(self, batch: ForwardBatch, size: int) -> None:
        bs = batch.batch_size
        live = (
            (self.input_ids, batch.input_ids),
            (self.positions, batch.positions),
            (self.out_loc, batch.out_cache_loc),
            (self.req_rows, batch.req_rows),
        )
        for buf, src in live:
            buf[:bs].copy_(src)
            buf[bs:size].zero_()


class DecodeGraphs(DecodeInputs):
    """Decode forward passes of up to ``max_bs`` requests, replayed from CUDA graphs.

    With ``capture=False`` (or before capture) :meth:`run` executes the same padded pass
    on the static buffers eagerly: what the graphs would replay, testable on the CPU.
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        attn: TritonAttention,
        ops: TorchOps,
        *,
        max_bs: int,
        device: torch.device,
        capture: bool = True,
    ) -> None:
        if not isinstance(model, LlamaForCausalLM):
            raise ConfigError(f"CUDA graphs need a model that runs, not {type(model).__name__}")
        if not isinstance(attn, TritonAttention) or attn.deterministic:
            raise ConfigError(
                "CUDA graphs need attention_backend='triton' outside deterministic mode"
            )
        if capture and device.type != "cuda":
            raise ConfigError(f"capturing CUDA graphs needs a CUDA device, not {device}")
        self.model, self.attn, self.ops = model, attn, ops
        self.sizes = batch_ladder(max_bs)
        self.max_context = min(GRAPH_MAX_CONTEXT, attn.req_to_token.shape[1])
        # [max_bs] int64 each; rows past a step's batch are padding: all zeros (a
        # padding row's table row 0 is a valid row, never read at seq_len 0)
        super().__init__(max_bs, device)
        self.seq_lens = torch.zeros_like(self.input_ids)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}  # each graph's output, [size, vocab]
        if capture:
            self._capture()

    def can_run(self, batch: ForwardBatch) -> bool:
        """Whether ``batch`` is a decode step a graph can run: every row sampled, nothing
        else asked, at most ``max_bs`` requests of at most ``max_context`` tokens."""
        return self.fits(batch) and max(batch.seq_lens) <= self.max_context

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [batch_size, vocab] float32, those of ``model(batch, attn, ops)``.

        After a replay they are a view of the graph's output: valid until the next run.
        """
        assert self.can_run(batch)
        bs = batch.batch_size
        size = self.sizes[bisect_left(self.sizes, bs)]
        self._load(batch, size)
        graph = self._graphs.get(size)
        if graph is None:
            return self._forward(size)[:bs]
        graph.replay()
        return self._logits[size][:bs]

    def _load(self, batch: ForwardBatch, size: int) -> None:
        """Copy ``batch`` into the static buffers' first rows and pad them to ``size``."""
        bs = batch.batch_size
        self.load(batch, size)
        # the one host-to-device copy: pinned, so it does not wait for the device
        on_cuda = self.seq_lens.is_cuda
        seq_lens = torch.tensor(
            batch.seq_lens + [0] * (size - bs), dtype=torch.int64, pin_memory=on_cuda
        )
        self.seq_lens[:size].copy_(seq_lens, non_blocking=on_cuda)

    def _forward(self, size: int) -> torch.Tensor:
        """The pass over the static buffers' first ``size`` rows: logits [size, vocab]."""
        self.attn.prepare_static_decode(
            self.req_rows[:size], self.seq_lens[:size], self.out_loc[:size], self.max_context
        )
        return self.model.compute(
            self.input_ids[:size], self.positions[:size], None, self.attn, self.ops
        )

    def _capture(self) -> None:
        # the buffers are all padding here: warm-up and capture write slot 0 alone
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        for size in reversed(self.sizes):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # compiles the kernels, and lets cuBLAS pick its own
                    self._forward(size)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._logits[size] = self._forward(size)
            self._graphs[size] = graph
        torch.cuda.synchronize()

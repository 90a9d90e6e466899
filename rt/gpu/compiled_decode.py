"""Decode steps compiled by torch.compile (inductor): the CPU's counterpart of CUDA graphs.

On a CPU a batch-1 decode step of a small model is mostly per-operation overhead:
~150 small operations (norms, rotary, residuals, the mask) at 5–20 µs each around
a few matmuls that stream the weights. Inductor fuses the small ones into a few
C++ loops, and with ``freezing`` it packs the linear layers' weights for MKL once,
at compile time (docs/benchmarks.md has the figures).

One graph per batch size of a ladder (:func:`rt.gpu.cuda_graph.batch_ladder`),
compiled when the engine starts (``warm_up``): a step pads its batch to the next
size, so no request ever waits for a compile. The context length is a dynamic
dimension of each graph (``mark_dynamic``), so a growing sequence never recompiles.

A padding row is token 0 at position 0 that stores its K/V in slot 0 (the pool's
reserved dummy slot) and attends to one key, the first slot of request-table row 0
(whatever request holds it: only read); its logits are dropped. Rows do not mix
anywhere in the pass, so padding changes no live row's arithmetic order except
inside the matmuls, whose kernels may block rows differently at another batch size.
In float32 the tokens stayed identical to eager in the tests; in bfloat16 they may
not: inductor keeps fused intermediates in float32 where eager rounds each op to
bfloat16 (a review measured logprobs up to 0.08 apart, a token differing at 24).

Only the torch attention backend, with no sliding-window layers: its decode step is
a plain masked SDPA over the gathered keys. Two of its forms are recast for the
compiler (:class:`_CompiledAttention`): the K/V store writes the pool through
``index_put_`` on the whole tensor (an ``index_copy_`` into a layer's view made
inductor copy the layer's whole buffer every step), and grouped-query attention is
a Python bool from the model's shape, not a traced comparison.
"""

from __future__ import annotations

import contextlib
import logging
import time
import types
import warnings
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from rt.errors import ConfigError
from rt.gpu.attention.torch_backend import TorchAttention
from rt.gpu.cuda_graph import DecodeInputs, batch_ladder
from rt.gpu.forward_batch import ForwardBatch
from rt.gpu.models.llama import LlamaForCausalLM
from rt.gpu.models.ops import TorchOps

log = logging.getLogger(__name__)


class _CompiledAttention(TorchAttention):
    """The torch backend's decode step, in forms inductor compiles in place."""

    def __init__(self, base: TorchAttention, num_heads: int) -> None:
        super().__init__(base.pool, base.req_to_token, base.windows)
        kv_heads = base.pool.k.shape[1]
        self._gqa = num_heads != kv_heads
        self._heads = torch.arange(kv_heads, device=base.req_to_token.device)[:, None]

    def prepare_decode(
        self, req_rows: torch.Tensor, seq_lens: list[int], out_loc: torch.Tensor
    ) -> None:
        device = self.req_to_token.device
        # at least 2 keys: a dimension of size 1 would be specialized, not dynamic
        max_kv = max(2, *seq_lens)
        self._out_loc = out_loc
        self._kv_flat = self.req_to_token[req_rows, :max_kv].flatten()
        lens = torch.tensor(seq_lens, device=device)
        mask = (torch.arange(max_kv, device=device)[None, :] < lens[:, None])[:, None, None, :]
        self._masks = {None: mask}
        self._shape = (len(seq_lens), 1)
        self._pad_index = None
        torch._dynamo.mark_dynamic(self._kv_flat, 0)
        torch._dynamo.mark_dynamic(mask, 3)

    def forward(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        pool_k, pool_v = self.pool.k, self.pool.v  # [layers, kv_heads, slots, head_dim]
        layer = torch.full((1, 1), layer_id, dtype=torch.int64, device=q.device)
        where = (layer, self._heads, self._out_loc[None, :])
        pool_k.index_put_(where, k.transpose(0, 1))
        pool_v.index_put_(where, v.transpose(0, 1))
        bs = self._shape[0]
        _, num_heads, head_dim = q.shape
        kv_shape = (pool_k.shape[1], bs, -1, head_dim)
        keys = pool_k[layer_id].index_select(1, self._kv_flat).view(kv_shape).transpose(0, 1)
        values = pool_v[layer_id].index_select(1, self._kv_flat).view(kv_shape).transpose(0, 1)
        out = F.scaled_dot_product_attention(
            q.view(bs, 1, num_heads, head_dim).transpose(1, 2),
            keys,
            values,
            attn_mask=self._masks[None],
            enable_gqa=self._gqa,
        )  # [bs, num_heads, 1, head_dim]
        return out.transpose(1, 2).reshape(bs, num_heads * head_dim)


class CompiledDecode(DecodeInputs):
    """Decode forward passes of up to ``max_bs`` requests, through compiled graphs."""

    def __init__(
        self, model: Any, attn: Any, ops: TorchOps, *, max_bs: int, device: torch.device
    ) -> None:
        if not isinstance(model, LlamaForCausalLM):
            raise ConfigError(f"torch.compile needs a model that runs, not {type(model).__name__}")
        if type(attn) is not TorchAttention:
            raise ConfigError(
                f"torch.compile needs attention_backend='torch', not {type(attn).__name__}"
            )
        if any(w is not None for w in attn.windows):
            raise ConfigError("torch.compile does not support sliding-window attention yet")
        self.model, self.ops = model, ops
        self.attn = _CompiledAttention(attn, model.config.num_heads)
        self.sizes = batch_ladder(max_bs)
        super().__init__(max_bs, device)
        self.runs = 0
        self._fn = _compile(model)

    def warm_up(self) -> None:
        """Compile every size now (all padding: they write slot 0 alone)."""
        start = time.monotonic()
        for size in self.sizes:
            self._forward(size, [2] * size)
        log.info(
            "compiled decode steps for batches of %s in %.1f s",
            ",".join(map(str, self.sizes)),
            time.monotonic() - start,
        )

    def can_run(self, batch: ForwardBatch) -> bool:
        """Whether ``batch`` is a decode step a compiled graph runs: every row sampled,
        nothing else asked, at most ``max_bs`` requests."""
        return self.fits(batch)

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [batch_size, vocab] float32, those of ``model(batch, attn, ops)``."""
        assert self.can_run(batch)
        bs = batch.batch_size
        size = self.sizes[bisect_left(self.sizes, bs)]
        self.load(batch, size)
        self.runs += 1
        return self._forward(size, list(batch.seq_lens) + [1] * (size - bs))[:bs]

    def _forward(self, size: int, seq_lens: list[int]) -> torch.Tensor:
        self.attn.prepare_decode(self.req_rows[:size], seq_lens, self.out_loc[:size])
        with torch.no_grad(), _settings(len(self.sizes)):
            out: torch.Tensor = self._fn(
                self.input_ids[:size], self.positions[:size], None, self.attn, self.ops
            )
        return out


def _compile(model: LlamaForCausalLM) -> Callable[..., torch.Tensor]:
    with warnings.catch_warnings():
        # inductor imports torch.utils.mkldnn, which warns that torch.jit.script_method,
        # its own decorator, is deprecated: torch's noise, not the caller's
        warnings.filterwarnings(
            "ignore", "`torch.jit.script_method` is deprecated", DeprecationWarning
        )
        import torch._inductor.compile_fx
    # compute's own inference_mode makes inductor fail on the frozen parameters
    # ("Cannot set version_counter for inference tensor"): compile the function under it.
    # Dynamo keeps its graphs on the code object, and freezing bakes this model's weights
    # into them with the module guards skipped: a second engine in this process would run
    # the first one's graphs. So each instance compiles a code object of its own.
    raw = type(model).compute.__wrapped__  # type: ignore[attr-defined]
    own = types.FunctionType(
        raw.__code__.replace(), raw.__globals__, raw.__name__, raw.__defaults__, raw.__closure__
    )
    return torch.compile(
        own.__get__(model),
        options={
            "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
            "cpp_wrapper": True,
        },
    )


@contextlib.contextmanager
def _settings(sizes: int) -> Iterator[None]:
    """The compiler settings of these graphs, for their calls alone (they are the
    process's): freezing folds the weights into constants and packs the linear layers
    for MKL (as a torch.compile option it is ignored: it is read from the config); one
    graph per batch size, never a dynamic batch."""
    import torch._dynamo
    import torch._inductor.config

    limit = max(torch._dynamo.config.recompile_limit, sizes + 1)
    with (
        torch._inductor.config.patch(freezing=True),
        torch._dynamo.config.patch(automatic_dynamic_shapes=False, recompile_limit=limit),
    ):
        yield

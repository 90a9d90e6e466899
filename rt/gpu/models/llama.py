"""The Llama family (Llama, Mistral, Qwen2, Qwen3) over a paged KV pool.

Parameter names follow the Hugging Face checkpoints so weights load by name,
but for the fused projections: ``qkv_proj`` (rows: q, k, v) and
``gate_up_proj`` (rows: gate, up), which the loader fills from the
checkpoint's separate weights (:data:`FUSED`).
Tokens of all requests are flattened: [num_tokens, hidden].
"""

from __future__ import annotations

import torch
from torch import nn

from rt.gpu.attention import AttentionBackend
from rt.gpu.forward_batch import ForwardBatch
from rt.gpu.model_config import ModelConfig
from rt.gpu.models.ops import TorchOps
from rt.gpu.models.rope import RotaryEmbedding

# a fused projection → the checkpoint's projections its rows hold, in order
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class FusedLinear(nn.Linear):
    """Several projections of the same input in one matmul: ``part_sizes`` rows each."""

    def __init__(self, in_features: int, part_sizes: tuple[int, ...], bias: bool) -> None:
        super().__init__(in_features, sum(part_sizes), bias=bias)
        self.part_sizes = part_sizes


class RMSNorm(nn.Module):
    """The weight and epsilon of an RMSNorm; the ops compute it (:class:`TorchOps`)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        h, d = cfg.hidden_size, cfg.head_dim
        q_size, kv_size = self.num_heads * d, self.num_kv_heads * d
        # q, k and v in one matmul (the loader fills its rows from q_proj, k_proj, v_proj)
        self.qkv_proj = FusedLinear(h, (q_size, kv_size, kv_size), cfg.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=cfg.o_bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, attn: AttentionBackend, ops: TorchOps) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = ops.linear(x, self.qkv_proj).split(self.qkv_proj.part_sizes, dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = ops.rms_norm(q, self.q_norm.weight, self.q_norm.eps)
            k = ops.rms_norm(k, self.k_norm.weight, self.k_norm.eps)
        q, k = ops.rope(q, k)
        return ops.linear(attn.forward(self.layer_id, q, k, v), self.o_proj)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        # gate and up in one matmul (the loader fills its rows from gate_proj, up_proj)
        self.gate_up_proj = FusedLinear(h, (i, i), cfg.mlp_bias)
        self.down_proj = nn.Linear(i, h, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor, ops: TorchOps) -> torch.Tensor:
        return ops.linear(ops.silu_mul(ops.linear(x, self.gate_up_proj)), self.down_proj)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_id)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        attn: AttentionBackend,
        ops: TorchOps,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's output, the residual stream before it): the next norm adds them."""
        norm = self.input_layernorm
        h, residual = ops.add_rms_norm(x, residual, norm.weight, norm.eps)
        h = self.self_attn(h, attn, ops)
        norm = self.post_attention_layernorm
        h, residual = ops.add_rms_norm(h, residual, norm.weight, norm.eps)
        return self.mlp(h, ops), residual


class LlamaBody(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # Given its (empty) weight, the embedding draws no initial values: the loader
        # fills it. On the meta device that draw (normal_) imports torch._dynamo, which
        # took 1.2 s of every scheduler start (restarts included) on this machine.
        weight = torch.empty(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Any of the four supported architectures; ``ModelConfig`` carries the differences.
    Built to be filled: the embedding's weight starts uninitialised (rt.gpu.loader builds
    it on the meta device, then loads or draws every weight)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)

    @torch.inference_mode()
    def forward(
        self, batch: ForwardBatch, attn: AttentionBackend, ops: TorchOps | None = None
    ) -> torch.Tensor:
        """Logits [len(batch.sample_indices), vocab] in float32."""
        attn.prepare(batch)
        return self.compute(batch.input_ids, batch.positions, batch.sample_indices, attn, ops)

    @torch.inference_mode()
    def compute(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        sample_indices: torch.Tensor | None,
        attn: AttentionBackend,
        ops: TorchOps | None = None,
    ) -> torch.Tensor:
        """The forward pass of a step ``attn`` is prepared for: logits [len(sample_indices),
        vocab] in float32 (None: every token's).

        Device work only, with shapes fixed by the tensors': a CUDA graph can capture it
        (rt/gpu/cuda_graph.py).
        """
        ops = ops or TorchOps()
        x = self.model.embed_tokens(input_ids)
        ops.begin(positions, self.rotary.inv_freq, x.dtype)
        residual = None
        for layer in self.model.layers:
            x, residual = layer(x, residual, attn, ops)
        assert residual is not None
        if sample_indices is not None:
            x, residual = x[sample_indices], residual[sample_indices]
        x = ops.rms_norm(x + residual, self.model.norm.weight, self.model.norm.eps)
        return ops.linear(x, self.lm_head).float()

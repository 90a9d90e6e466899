"""The Llama family (Llama, Mistral, Qwen2, Qwen3) over a paged KV pool.

Parameter names follow the Hugging Face checkpoints so weights load by name,
but for the fused projections: ``qkv_proj`` (rows: q, k, v) and
``gate_up_proj`` (rows: gate, up), which the loader fills from the
checkpoint's separate weights (:data:`FUSED`).
Tokens of all requests are flattened: [num_tokens, hidden].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rt.gpu.attention import AttentionBackend
from rt.gpu.forward_batch import ForwardBatch
from rt.gpu.model_config import ModelConfig
from rt.gpu.models.rope import RotaryEmbedding, apply_rope

# a fused projection → the checkpoint's projections its rows hold, in order
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class FusedLinear(nn.Linear):
    """Several projections of the same input in one matmul: ``part_sizes`` rows each."""

    def __init__(self, in_features: int, part_sizes: tuple[int, ...], bias: bool) -> None:
        super().__init__(in_features, sum(part_sizes), bias=bias)
        self.part_sizes = part_sizes


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


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

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.part_sizes, dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.o_proj(attn.forward(self.layer_id, q, k, v))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        # gate and up in one matmul (the loader fills its rows from gate_proj, up_proj)
        self.gate_up_proj = FusedLinear(h, (i, i), cfg.mlp_bias)
        self.down_proj = nn.Linear(i, h, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_id)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Any of the four supported architectures; ``ModelConfig`` carries the differences."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Logits [len(batch.sample_indices), vocab] in float32."""
        x = self.model.embed_tokens(batch.input_ids)
        cos, sin = self.rotary.cos_sin(batch.positions, x.dtype)
        attn.prepare(batch)
        for layer in self.model.layers:
            x = layer(x, cos, sin, attn)
        x = self.model.norm(x[batch.sample_indices])
        return self.lm_head(x).float()

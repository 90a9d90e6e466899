"""The model description rt needs, parsed from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rt.errors import ModelLoadError, UnsupportedModelError

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and options of a Llama-family decoder, whatever the checkpoint's dialect."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    # per layer: None (full attention) or the window (a token attends to itself and window-1 before it)
    sliding_windows: tuple[int | None, ...] = ()
    initializer_range: float = 0.02
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if min(self.num_heads, self.num_kv_heads, self.num_layers, self.hidden_size) < 1:
            raise ModelLoadError(
                "config.json: num_attention_heads, num_key_value_heads, num_hidden_layers "
                "and hidden_size must be positive"
            )
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"config.json: num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if len(self.sliding_windows) != self.num_layers:
            raise ModelLoadError(
                f"config.json: layer_types names {len(self.sliding_windows)} layers, "
                f"num_hidden_layers {self.num_layers}"
            )

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Parse a config.json dict; raise UnsupportedModelError for what rt does not implement."""
        archs = raw.get("architectures") or [_arch_from_model_type(raw.get("model_type"))]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"architecture {arch!r} is not supported; rt implements {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(f"hidden_act {act!r} is not supported; expected 'silu'")
        try:
            hidden = int(raw["hidden_size"])
            num_heads = int(raw["num_attention_heads"])
            num_layers = int(raw["num_hidden_layers"])
            rope = _rope_params(raw)
            cfg = cls(
                architecture=arch,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=num_layers,
                num_heads=num_heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
                head_dim=int(raw.get("head_dim") or hidden // num_heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope.pop("rope_theta", 10000.0)),
                rope_scaling=rope,
                max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                qkv_bias=arch == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
                o_bias=arch != "Qwen2ForCausalLM" and bool(raw.get("attention_bias", False)),
                mlp_bias=bool(raw.get("mlp_bias", False)),
                qk_norm=arch == "Qwen3ForCausalLM",
                sliding_windows=_sliding_windows(raw, arch, num_layers),
                initializer_range=float(raw.get("initializer_range", 0.02)),
                eos_token_ids=_as_ids(raw.get("eos_token_id")),
            )
        except KeyError as err:
            raise ModelLoadError(f"config.json lacks the required field {err.args[0]!r}") from err
        except (TypeError, ValueError, ZeroDivisionError) as err:  # a field of the wrong type
            raise ModelLoadError(f"config.json has a field rt cannot read: {err}") from err
        rope_type = cfg.rope_scaling.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope type {rope_type!r} is not supported; rt implements {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        return cfg

    @classmethod
    def from_dir(cls, model_path: str | Path) -> ModelConfig:
        """Read ``config.json`` from a model directory."""
        path = Path(model_path) / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"{path} not found: a model directory needs a config.json")
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ModelLoadError(f"{path} is not valid JSON: {err}") from err
        if not isinstance(raw, dict):
            raise ModelLoadError(f"{path}: expected a JSON object, got {type(raw).__name__}")
        return cls.from_dict(raw)

    @property
    def num_params(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        layer = attn + 3 * h * i + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + embed + h


def _arch_from_model_type(model_type: str | None) -> str:
    names = {
        "llama": "LlamaForCausalLM",
        "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
    }
    if model_type not in names:
        raise UnsupportedModelError(
            f"model_type {model_type!r} without 'architectures' is not supported; "
            f"rt implements {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return names[model_type]


def _rope_params(raw: dict[str, Any]) -> dict[str, Any]:
    # transformers >= 5 writes rope_parameters (theta included); older checkpoints
    # write rope_theta plus an optional rope_scaling dict with "type" or "rope_type".
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    if "rope_theta" not in params and "rope_theta" in raw:
        params["rope_theta"] = raw["rope_theta"]
    return params


def _sliding_windows(raw: dict[str, Any], arch: str, num_layers: int) -> tuple[int | None, ...]:
    window = raw.get("sliding_window")
    layer_types = raw.get("layer_types")
    if arch == "MistralForCausalLM":
        return (int(window) if window else None,) * num_layers
    if layer_types and window:
        return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)
    if raw.get("use_sliding_window") and window:
        first = int(raw.get("max_window_layers", num_layers))
        return tuple(int(window) if i >= first else None for i in range(num_layers))
    return (None,) * num_layers


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value if v is not None)

"""Helpers shared by tests/gpu: tiny checkpoints and a loop that drives an EngineCore."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from kernels import device_type
from rt.gpu import EngineConfig, EngineCore, SamplingParams

# where the triton backend's kernels take tensors in this process: the CPU (under
# Triton's interpreter) without CUDA, as in CI; the GPU on a machine with CUDA
KERNELS_DEVICE = device_type()
VOCAB = 256
COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    initializer_range=0.5,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
ARCHS: dict[str, dict[str, Any]] = {
    # GQA, llama3 rope scaling, untied
    "llama": dict(
        num_key_value_heads=2,
        rope_theta=5000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    # MQA, head_dim != hidden / heads, a sliding window shorter than the prompts
    "mistral": dict(num_key_value_heads=1, head_dim=32, sliding_window=12),
    # qkv bias, tied embeddings, linear rope scaling
    "qwen2": dict(
        num_key_value_heads=2,
        tie_word_embeddings=True,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    ),
    # q/k norm, head_dim != hidden / heads
    "qwen3": dict(num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5),
}


def make_checkpoint(arch: str, path: Path) -> Path:
    import transformers

    cls_cfg = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
    }[arch]
    cls_model = {
        "llama": transformers.LlamaForCausalLM,
        "mistral": transformers.MistralForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
    }[arch]
    cfg = cls_cfg(**COMMON, **ARCHS[arch])
    torch.manual_seed(1234)
    model = cls_model(cfg)
    if arch == "qwen2":
        with torch.no_grad():  # biases start at zero: make them matter
            for layer in model.model.layers:
                for proj in (
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                ):
                    proj.bias.normal_(0.0, 0.5)
    model.save_pretrained(path)
    return path


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def prompts(n: int, lengths: Iterable[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, VOCAB, (length,), generator=g).tolist()
        for length, _ in zip(lengths, range(n), strict=False)
    ]


def make_engine(path: Path | None = None, **kwargs: Any) -> EngineCore:
    """An engine on the CPU, or where the kernels run (KERNELS_DEVICE) when it uses them."""
    if kwargs.get("attention_backend") == "triton" or kwargs.get("deterministic"):
        kwargs.setdefault("device", KERNELS_DEVICE)
    kwargs.setdefault("max_total_tokens", 4096)
    kwargs.setdefault("max_running_requests", 32)
    return EngineCore(EngineConfig(model_path=path, **kwargs))


def run_all(
    engine: EngineCore,
    reqs: dict[str, tuple[list[int], SamplingParams]],
    check_every_step: bool = True,
) -> dict[str, dict[str, Any]]:
    """Add every request, step until done; return per-rid tokens, logprobs and the final output."""
    for rid, (ids, params) in reqs.items():
        engine.add_request(rid, ids, params)
    results = drain(engine, check_every_step)
    assert not engine.has_work, "engine did not finish"
    return results


def drain(
    engine: EngineCore,
    check_every_step: bool = True,
    max_steps: int = 10_000,
    results: dict[str, dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Step until idle (or ``max_steps``), collecting outputs into ``results``."""
    results = {} if results is None else results
    for _ in range(max_steps):
        if not engine.has_work:
            break
        step = engine.step()
        for o in step.outputs:
            key = o.rid if o.index == 0 else f"{o.rid}#{o.index}"
            r = results.setdefault(key, {"tokens": [], "logprobs": [], "top": [], "final": None})
            r["tokens"].extend(o.token_ids)
            r["logprobs"].extend(o.logprobs or [])
            r["top"].extend(o.top_logprobs or [])
            if o.finish_reason is not None:
                r["final"] = o
        if check_every_step:
            engine.check_integrity()
    else:
        return results
    engine.check_integrity()
    return results


def greedy(max_new_tokens: int, **kwargs: Any) -> SamplingParams:
    """Greedy, stopping at EOS as transformers' generate does."""
    return SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, **kwargs)

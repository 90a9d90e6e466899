"""Build a model and fill its weights: safetensors (sharded or not), dummy, or null."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from rt.errors import ConfigError, ModelLoadError
from rt.gpu.model_config import ModelConfig
from rt.gpu.models.llama import FUSED, FusedLinear, LlamaForCausalLM
from rt.gpu.models.rope import rope_inv_freq

log = logging.getLogger(__name__)

LOAD_FORMATS = ("auto", "safetensors", "dummy", "null")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ConfigError(f"dtype={name!r} is not supported; expected one of {sorted(DTYPES)}")
    return DTYPES[name]


def load_model(
    cfg: ModelConfig,
    model_path: str | Path | None,
    load_format: str,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
) -> LlamaForCausalLM:
    """The model on ``device`` in ``dtype``, weights from ``model_path`` or random (dummy)."""
    if load_format not in LOAD_FORMATS or load_format == "null":
        raise ConfigError(
            f"load_format={load_format!r} cannot build a model; expected one of {LOAD_FORMATS[:3]}"
        )
    # built on the meta device and cast there, then allocated once, in the target dtype on
    # the target device: no float32 copy ever exists (it would stay in CUDA's caching
    # allocator, where the KV pool's sizing cannot see it)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).to(dtype)
    _allocate(model, device)  # (tied weights stay tied)
    # inv_freq is a non-persistent buffer, and _allocate left it uninitialised (the build's
    # table was cast to ``dtype`` besides): compute it again, in float32, on the device
    model.rotary.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling).to(device)
    if load_format == "dummy":
        _init_dummy(model, cfg, seed)
    else:
        if model_path is None:
            raise ConfigError("load_format='safetensors' needs a model_path")
        _load_safetensors(model, Path(model_path))
    if device.type == "cpu" and dtype == torch.float32:
        _column_major(model)
    return model.eval()


def _column_major(model: nn.Module) -> None:
    """Store every linear layer's weight ([out, in]) column-major, its transpose
    contiguous: ``F.linear`` then multiplies by a contiguous [in, out] matrix, for
    which MKL's float32 kernels took 0.5–0.6× the time of the row-major layout at
    1–2 rows, 0.85× at 16 and 0.9× at 64, all of a step's weights in turn
    (docs/benchmarks.md). A weight tied to the embedding gets a copy of its own: the
    embedding looks up rows, ~20× slower in this layout."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear):
                weight = module.weight
                module.weight = nn.Parameter(
                    weight.t().contiguous().t(), requires_grad=weight.requires_grad
                )


def _allocate(model: nn.Module, device: torch.device) -> None:
    """Give every parameter and buffer of a meta-built ``model`` uninitialised memory on
    ``device``, once per tensor (tied weights stay tied). ``Module.to_empty`` does the same
    through ``empty_like`` of each meta tensor, which runs torch's Python reference and
    imports sympy on its first call: 0.4 s of every scheduler start."""
    made: dict[int, torch.Tensor] = {}

    def fresh(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            new = torch.empty(t.shape, dtype=t.dtype, device=device)
            if isinstance(t, nn.Parameter):
                new = nn.Parameter(new, requires_grad=t.requires_grad)
            made[id(t)] = new
        return made[id(t)]

    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            new = fresh(param)
            assert isinstance(new, nn.Parameter)
            module.register_parameter(name, new)
        for name, buf in list(module.named_buffers(recurse=False)):
            setattr(module, name, fresh(buf))


def _init_dummy(model: nn.Module, cfg: ModelConfig, seed: int) -> None:
    """Random weights drawn on the model's device, in its dtype (an 8B model's draw on
    the host took over a minute)."""
    with torch.no_grad():
        for i, (name, param) in enumerate(model.named_parameters()):
            if name.endswith("norm.weight") or "layernorm" in name:
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                # one generator per parameter: its values do not depend on the others' sizes
                draw = seed * 1_000_003 + i  # (past what torch takes: wrapped, not refused)
                draw = draw if -(1 << 63) <= draw < 1 << 64 else draw % (1 << 64)
                gen = torch.Generator(device=param.device).manual_seed(draw)
                param.normal_(0.0, cfg.initializer_range, generator=gen)


def shard_files(model_path: Path) -> list[Path]:
    """The safetensors files of a checkpoint, from its index when it is sharded."""
    index = model_path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as err:
            raise ModelLoadError(f"{index} is not a valid safetensors index: {err}") from err
        files = [model_path / name for name in dict.fromkeys(weight_map.values())]
    else:
        files = sorted(model_path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"no *.safetensors weights in {model_path}; rt loads safetensors only "
            "(convert .bin checkpoints, or use load_format='dummy')"
        )
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ModelLoadError(f"shards named by the index are missing in {model_path}: {missing}")
    return files


def _iter_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of every shard, with progress: a tqdm bar on a terminal, else a log line per shard."""
    from safetensors import safe_open

    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm

        total = 0
        for path in files:  # headers only: cheap
            with safe_open(str(path), framework="pt") as f:
                total += len(f.keys())
        bar = tqdm(total=total, desc="loading weights", unit="tensor")
    for i, path in enumerate(files):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, f.get_tensor(name)
                if bar is not None:
                    bar.update(1)
        if bar is None:
            log.info("loaded weights %s (%d/%d shards)", path.name, i + 1, len(files))
    if bar is not None:
        bar.close()


def checkpoint_targets(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each weight name of a Hugging Face checkpoint → what it fills: a parameter,
    or rows of a fused one (``q_proj`` → the first rows of ``qkv_proj``, …)."""
    out: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        holder, _, leaf = name.rpartition(".")  # "model.layers.0.mlp.gate_up_proj", "weight"
        owner, _, proj = holder.rpartition(".")
        if proj not in FUSED:
            out[name] = param
            continue
        fused = model.get_submodule(holder)
        assert isinstance(fused, FusedLinear)
        for part, rows in zip(FUSED[proj], param.split(fused.part_sizes, dim=0), strict=True):
            out[f"{owner}.{part}.{leaf}"] = rows
    return out


def _load_safetensors(model: LlamaForCausalLM, model_path: Path) -> None:
    files = shard_files(model_path)
    embed = model.model.embed_tokens.weight
    untied = model.config.tie_word_embeddings and {EMBED, HEAD} <= _names(files)
    if untied:  # config.json ties them, the checkpoint has two: as transformers, two
        model.lm_head.weight = nn.Parameter(torch.empty_like(embed), requires_grad=False)
    params = checkpoint_targets(model)
    loaded: set[str] = set()
    unexpected: list[str] = []
    with torch.no_grad():
        for name, tensor in _iter_tensors(files):
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            param = params.get(name)
            if param is None:
                unexpected.append(name)
                continue
            if tuple(param.shape) != tuple(tensor.shape):
                raise ModelLoadError(
                    f"weight {name}: expected shape {tuple(param.shape)}, checkpoint has {tuple(tensor.shape)}"
                )
            param.copy_(tensor.to(param.dtype))  # a fused parameter's rows: a view, filled in place
            loaded.add(name)
    if unexpected:
        raise ModelLoadError(
            f"checkpoint has weights this architecture does not use: {unexpected[:5]}"
        )
    missing = sorted(set(params) - loaded)
    if HEAD in missing and model.config.tie_word_embeddings:
        missing.remove(HEAD)
    if EMBED in missing and HEAD in loaded and model.config.tie_word_embeddings:
        missing.remove(EMBED)
    if missing:
        raise ModelLoadError(f"checkpoint lacks weights: {missing[:5]} (of {len(missing)})")
    if untied:
        if torch.equal(model.lm_head.weight, embed):  # the one tensor saved twice
            model.lm_head.weight = embed
        else:
            log.warning(
                "config.json ties the output head to the embedding, and the checkpoint "
                "has a head of its own: it is used (as transformers does)"
            )


def _names(files: list[Path]) -> set[str]:
    """The tensors' names in ``files`` (their headers alone)."""
    from safetensors import safe_open

    names: set[str] = set()
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            names.update(f.keys())
    return names

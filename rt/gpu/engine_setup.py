"""Assemble an engine core's parts from its config: model, KV pool, caches, planners."""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from rt.errors import ConfigError, ModelLoadError, RtError
from rt.gpu.attention import SLOTS_MAJOR_BACKENDS, create_attention_backend
from rt.gpu.engine_config import EngineConfig
from rt.gpu.kv_cache import KVCacheManager, ReqTable
from rt.gpu.kv_pool import KVPool, PageAllocator
from rt.gpu.loader import load_model, resolve_dtype
from rt.gpu.model_config import ModelConfig
from rt.gpu.model_dir import ModelFiles, read_model_dir
from rt.gpu.model_runner import ModelRunner, NullModel
from rt.gpu.models.ops import create_ops
from rt.gpu.planners import DecodePlanner, PrefillPlanner
from rt.gpu.radix_cache import RadixCache

log = logging.getLogger(__name__)


@dataclass
class EngineParts:
    model_files: ModelFiles | None
    model_config: ModelConfig
    eos_token_ids: tuple[int, ...]
    context_length: int
    cache: KVCacheManager
    runner: ModelRunner
    prefill: PrefillPlanner
    decode: DecodePlanner


@contextmanager
def _loading(path: str | Path | None) -> Iterator[None]:
    """What goes wrong reading a model's files, as a ModelLoadError that names them:
    a truncated or corrupt shard, a field of the wrong type, a rope setting that
    lacks a key. The actor's start is then refused (rt.actors.child): a restart
    would read the same files and fail alike, after loading what it could again.
    Running out of memory is not the files' fault: raised as it is (on the CPU, torch
    says so in a RuntimeError, "DefaultCPUAllocator: can't allocate memory" or
    "unable to mmap …: Cannot allocate memory (12)"; an OSError has ENOMEM)."""
    try:
        yield
    except (RtError, MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as err:
        if isinstance(err, OSError) and err.errno == errno.ENOMEM:
            raise
        if isinstance(err, RuntimeError) and "allocate memory" in str(err).lower():
            raise
        raise ModelLoadError(
            f"cannot load the model in {path}: {type(err).__name__}: {err}"
        ) from err


def build_parts(config: EngineConfig) -> EngineParts:
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device; use device='cpu'")
    dtype = resolve_dtype(config.dtype)
    files = None
    if config.model_path is not None and config.model_config is None:
        with _loading(config.model_path):
            files = read_model_dir(config.model_path)
        model_config, eos = files.config, files.eos_token_ids
    else:
        assert config.model_config is not None
        model_config, eos = config.model_config, config.model_config.eos_token_ids
    context_length = config.context_length or model_config.max_position_embeddings

    start = time.monotonic()
    attn_layers = model_config.num_layers
    if config.load_format == "null":
        model: object = NullModel(model_config.vocab_size, eos)
        attn_layers = 0  # no KV is ever computed
    else:
        path = Path(config.model_path) if config.model_path is not None else None
        load_format = "safetensors" if config.load_format == "auto" else config.load_format
        with _loading(path):
            model = load_model(model_config, path, load_format, dtype, device, seed=config.seed)
    log.info(
        "model ready in %.1f s (%s, %s, %s)",
        time.monotonic() - start,
        model_config.architecture,
        dtype,
        device,
    )

    ps = config.page_size
    total_tokens = config.max_total_tokens or _tokens_from_memory(
        config, model_config, dtype, device
    )
    num_pages = max(2, total_tokens // ps + 1)  # + the reserved page 0
    try:
        pool = KVPool(
            num_pages,
            ps,
            attn_layers,
            model_config.num_kv_heads,
            model_config.head_dim,
            dtype,
            device,
            slots_major=config.backend in SLOTS_MAJOR_BACKENDS,
        )
        allocator = PageAllocator(num_pages, ps)
        width = min(context_length, (num_pages - 1) * ps)
        table = ReqTable(config.max_running_requests + 1, width, device)
    except (MemoryError, RuntimeError) as err:  # (torch's out of memory is a RuntimeError)
        # a ConfigError: every start would fail the same way (no crash loop of restarts)
        raise ConfigError(
            f"a KV pool of {total_tokens} tokens and a table of {config.max_running_requests} "
            f"requests do not fit on {device} ({type(err).__name__}: {err}); lower "
            "max_total_tokens or max_running_requests"
        ) from err
    tree = RadixCache(ps, device)
    cache = KVCacheManager(allocator, table, tree, config.enable_prefix_cache)
    attn = None
    if config.load_format != "null":
        attn = create_attention_backend(
            config.backend,
            pool,
            table.slots,
            model_config.sliding_windows,
            config.deterministic,
        )
    ops = create_ops(config.backend, config.deterministic)
    runner = ModelRunner(model, attn, device, ops)  # type: ignore[arg-type]
    if config.use_cuda_graph:
        from rt.gpu.cuda_graph import DecodeGraphs

        start = time.monotonic()
        runner.graphs = DecodeGraphs(
            model,  # type: ignore[arg-type]
            attn,  # type: ignore[arg-type]
            ops,
            max_bs=config.graph_max_bs,
            device=device,
        )
        log.info(
            "captured %d CUDA graphs of decode steps (batches up to %d) in %.1f s",
            len(runner.graphs.sizes),
            runner.graphs.max_bs,
            time.monotonic() - start,
        )
    if config.torch_compile:
        from rt.gpu.compiled_decode import CompiledDecode

        runner.compiled = CompiledDecode(
            model,
            attn,
            ops,
            max_bs=min(config.torch_compile_max_bs, config.max_running_requests),
            device=device,
        )
        runner.compiled.warm_up()
    prefill = PrefillPlanner(
        cache,
        config.schedule_policy,
        config.max_running_requests,
        config.max_prefill_tokens,
        config.prefill_chunk,
    )
    return EngineParts(
        files, model_config, eos, context_length, cache, runner, prefill, DecodePlanner(cache)
    )


def _tokens_from_memory(
    config: EngineConfig, cfg: ModelConfig, dtype: torch.dtype, device: torch.device
) -> int:
    per_token = KVPool.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype)
    if device.type == "cuda":
        # what the caching allocator holds but no tensor uses (load-time temporaries) is free
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(device)
    else:
        free = _host_available_bytes()
    fraction = config.kv_mem_fraction
    tokens = int(free * fraction) // per_token
    # more than every running request at full context is never needed (and host RAM is shared)
    tokens = min(
        tokens, config.max_running_requests * (config.context_length or cfg.max_position_embeddings)
    )
    if tokens < 2 * config.page_size:
        raise ConfigError(
            f"mem_fraction={fraction} leaves room for {tokens} KV tokens; "
            "raise it or set max_total_tokens"
        )
    log.info("KV pool: %d tokens (%.1f MiB)", tokens, tokens * per_token / 2**20)
    return tokens


def _host_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30

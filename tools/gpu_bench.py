"""GPU throughput of rt's engine core per attention backend, vs transformers and the roofline.

    .venv/bin/python tools/gpu_bench.py [--device cuda] [--shapes 1b,8b] \
        [--backends torch,triton,triton-eager,triton-sync,flashinfer] [--steps 64] [--skip-hf] [--skip-offline] \
        [--threads N] [--max-total-tokens N | --mem-fraction 0.5] [--json PATH]
    .venv/bin/python tools/gpu_bench.py --smoke    # a tiny float32 model on CPU, in seconds

Models: dummy (random) weights in the shapes of Llama-3.2-1B and Llama-3.1-8B,
bfloat16. rt rows run one ``EngineCore`` per (shape, backend), greedy, EOS
ignored, prompts of random token ids (no prefix-cache hits); sizes are
:class:`Plan`'s defaults (``--smoke`` shrinks them):

* ``decode bN`` (N = 1, 8, 64): N requests of 128-token prompts are prefilled
  and 8 decode steps run to warm up; then ``--steps`` decode steps are timed,
  the device synchronised before and after: N * steps / seconds.
* ``prefill 8192``: 8 prompts of 1024 tokens (one new token each) from
  submission until all have finished, after a warm-up run of the same shape:
  prompt tokens / seconds.
* ``offline NxM`` (64x256 and 256x256): N requests, prompt lengths uniform in
  128..1024 (seeded), M new tokens each, submitted at once and run to
  completion: output tokens / seconds, and the core's retraction count.
* backend ``transformers``: the same decode and prefill through
  ``AutoModelForCausalLM.from_config`` (random weights, sdpa attention, eager)
  on the same device: a hand-written greedy loop over ``model(...)`` with a
  ``StaticCache`` (not ``generate``), synchronised only around the timed loop.
* backend variants: ``triton-eager`` without CUDA graphs, ``triton-sync``
  without overlap scheduling, ``triton-deterministic`` with batch-invariant
  kernels (suffixes combine: ``triton-eager-sync``). The gain of graphs and of
  overlap is the ``triton`` row over these, in the same run.
* ``roofline bN``: measured device copy bandwidth (bytes read + written by a
  1 GiB tensor copy, best of 10) over the bytes one decode step reads: every
  weight once (the embedding matrix only as the lm_head; the lookup's one row
  per token is left out) plus each request's KV at the timed steps' mean
  context. A decode row's "% of limit" is its tok/s over the roofline at its batch.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rt.errors import ConfigError  # noqa: E402
from rt.gpu import EngineConfig, EngineCore, ModelConfig, SamplingParams  # noqa: E402
from rt.gpu.attention import SLOTS_MAJOR_BACKENDS, create_attention_backend  # noqa: E402
from rt.gpu.kv_pool import KVPool  # noqa: E402
from rt.gpu.loader import resolve_dtype  # noqa: E402

sys.path.insert(0, str(REPO / "tools"))
from roofline import Roofline, copy_bandwidth, timed, weight_bytes_read  # noqa: E402


def _llama3_rope(factor: float, original_max_position_embeddings: int) -> dict[str, Any]:
    return dict(
        rope_type="llama3",
        factor=factor,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=original_max_position_embeddings,
    )


# config.json of each shape, as Hugging Face publishes it (weights are random)
_LLAMA: dict[str, Any] = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_act="silu",
    vocab_size=128256,
    num_attention_heads=32,
    num_key_value_heads=8,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    max_position_embeddings=131072,
    initializer_range=0.02,
    bos_token_id=128000,
    eos_token_id=[128001, 128008, 128009],
)
SHAPES: dict[str, dict[str, Any]] = {
    "1b": _LLAMA
    | dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        head_dim=64,
        tie_word_embeddings=True,
        rope_scaling=_llama3_rope(32.0, 8192),
    ),
    "8b": _LLAMA
    | dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        head_dim=128,
        tie_word_embeddings=False,
        rope_scaling=_llama3_rope(8.0, 8192),
    ),
    "tiny": _LLAMA
    | dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        rope_scaling=_llama3_rope(4.0, 512),
    ),
}
DECODE_BATCHES = (1, 8, 64)
DEVICE_ERROR_EXIT = 2


@dataclass(frozen=True)
class Plan:
    """What to run; ``--smoke`` shrinks every size."""

    device: str
    dtype: str
    shapes: tuple[str, ...]
    backends: tuple[str, ...]
    steps: int = 64
    warmup: int = 8
    prompt_len: int = 128
    prefill_tokens: int = 8192
    prefill_prompt_len: int = 1024
    offline_requests: tuple[int, ...] = (64, 256)
    offline_prompt: tuple[int, int] = (128, 1024)
    offline_new: int = 256
    context_length: int = 4096  # bounds rt's request table; every workload fits it
    max_total_tokens: int | None = None
    mem_fraction: float | None = None  # None: the engine's default
    copy_mib: int = 1024
    threads: int | None = None  # torch's intra-op threads (None: torch's default)
    skip_hf: bool = False
    skip_offline: bool = False


@dataclass
class Row:
    """One line of the table; ``tok_s`` None when the backend could not be built."""

    shape: str
    workload: str
    backend: str
    tok_s: float | None
    pct_of_limit: float | None = None
    note: str = ""
    extra: dict[str, int] = field(default_factory=dict)


def decode_context(plan: Plan) -> float:
    """Mean tokens each request attends over in the timed decode steps."""
    return plan.prompt_len + plan.warmup + 1 + (plan.steps - 1) / 2


def random_prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(length)]


# ---- rt ------------------------------------------------------------------------------


# a backend's name may end in variants, each turning an option of the engine off or on:
# "triton-deterministic" (batch-invariant kernels), "triton-eager" (no CUDA graphs),
# "triton-sync" (no overlap scheduling), or several: "triton-eager-sync"
VARIANTS: dict[str, dict[str, bool]] = {
    "-deterministic": {"deterministic": True},
    "-eager": {"cuda_graph": False},
    "-sync": {"overlap_schedule": False},
}


def _split_backend(name: str) -> tuple[str, dict[str, bool]]:
    """("triton-eager-sync") → ("triton", {"cuda_graph": False, "overlap_schedule": False})."""
    options: dict[str, bool] = {}
    while True:
        suffix = next((v for v in VARIANTS if name.endswith(v)), None)
        if suffix is None:
            return name, options
        name = name[: -len(suffix)]
        options.update(VARIANTS[suffix])


def probe_backend(name: str, cfg: ModelConfig, plan: Plan) -> None:
    """Build ``name`` over a two-slot pool, so an unavailable backend fails before the
    model is loaded (the 8B dummy init takes a while). Raises ConfigError."""
    dtype, device = resolve_dtype(plan.dtype), torch.device(plan.device)
    name, options = _split_backend(name)
    deterministic = options.get("deterministic", False)
    slots_major = name in SLOTS_MAJOR_BACKENDS
    pool = KVPool(2, 1, 1, cfg.num_kv_heads, cfg.head_dim, dtype, device, slots_major)
    table = torch.zeros(2, 2, dtype=torch.int64, device=device)
    create_attention_backend(name, pool, table, cfg.sliding_windows[:1], deterministic)


def build_engine(cfg: ModelConfig, backend: str, plan: Plan) -> EngineCore:
    backend, options = _split_backend(backend)
    return EngineCore(
        EngineConfig(
            model_config=cfg,
            load_format="dummy",
            dtype=plan.dtype,
            device=plan.device,
            attention_backend=backend,
            **options,  # type: ignore[arg-type]
            max_total_tokens=plan.max_total_tokens,
            mem_fraction=plan.mem_fraction,
            max_running_requests=max(max(DECODE_BATCHES), *plan.offline_requests),
            context_length=plan.context_length,
        )
    )


def _finish_all(core: EngineCore, rids: Sequence[str]) -> None:
    for rid in rids:
        core.abort(rid)
    core.apply_commands()
    core.flush_cache()
    assert not core.has_work


def rt_decode(core: EngineCore, batch: int, plan: Plan) -> tuple[float, float]:
    """(tok/s of ``plan.steps`` decode steps at ``batch``, mean context length over them)."""
    rng, vocab = random.Random(batch), core.model_config.vocab_size
    params = SamplingParams(
        temperature=0.0, max_new_tokens=plan.warmup + plan.steps + 2, ignore_eos=True
    )
    rids = [f"decode{batch}-{i}" for i in range(batch)]
    for rid in rids:
        core.add_request(rid, random_prompt(rng, plan.prompt_len, vocab), params)
    for _ in range(10_000):
        if not core.next_step_prefills:
            break
        core.step()
    if len(core.running) != batch:
        raise RuntimeError(f"decode b{batch}: only {len(core.running)} requests fit the KV pool")
    for _ in range(plan.warmup):
        core.step()
    modes: list[tuple[str, int]] = []

    def run() -> None:
        for _ in range(plan.steps):
            out = core.step()
            modes.append((out.forward_mode, out.num_tokens))

    secs = timed(core.device, run)
    assert modes == [("decode", batch)] * plan.steps, "a timed step was not a full decode"
    _finish_all(core, rids)
    return batch * plan.steps / secs, decode_context(plan)


def _run_to_completion(core: EngineCore, prompts: list[list[int]], new: int, tag: str) -> int:
    """Submit every prompt, step until idle; the number of output tokens."""
    params = SamplingParams(temperature=0.0, max_new_tokens=new, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        core.add_request(f"{tag}-{i}", prompt, params)
    tokens = 0
    while core.has_work:
        tokens += sum(len(o.token_ids) for o in core.step().outputs)
    core.flush_cache()
    return tokens


def prefill_prompts(plan: Plan, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    n = max(1, plan.prefill_tokens // plan.prefill_prompt_len)
    return [random_prompt(rng, plan.prefill_prompt_len, vocab) for _ in range(n)]


def rt_prefill(core: EngineCore, plan: Plan) -> float:
    vocab = core.model_config.vocab_size
    _run_to_completion(core, prefill_prompts(plan, vocab, seed=1001), 1, "prefill-warmup")
    prompts = prefill_prompts(plan, vocab, seed=1002)
    secs = timed(core.device, lambda: _run_to_completion(core, prompts, 1, "prefill"))
    return sum(len(p) for p in prompts) / secs


def rt_offline(core: EngineCore, num_requests: int, plan: Plan) -> tuple[float, int]:
    """(output tok/s, retractions) of ``num_requests`` requests run to completion."""
    rng, vocab = random.Random(10_000 + num_requests), core.model_config.vocab_size
    lo, hi = plan.offline_prompt
    prompts = [random_prompt(rng, rng.randint(lo, hi), vocab) for _ in range(num_requests)]
    retractions = core.num_retractions
    tokens = 0

    def run() -> None:
        nonlocal tokens
        tokens = _run_to_completion(core, prompts, plan.offline_new, f"offline{num_requests}")

    secs = timed(core.device, run)
    assert tokens == num_requests * plan.offline_new
    return tokens / secs, core.num_retractions - retractions


def bench_rt(
    shape: str, cfg: ModelConfig, backend: str, plan: Plan, roofline: Roofline
) -> list[Row]:
    try:
        probe_backend(backend, cfg, plan)
        core = build_engine(cfg, backend, plan)
    except ConfigError as err:
        return [Row(shape, "all", backend, None, note=f"unavailable: {err}")]
    rows: list[Row] = []
    for batch in DECODE_BATCHES:
        tok_s, context = rt_decode(core, batch, plan)
        limit = roofline.limit(batch, context)
        rows.append(Row(shape, f"decode b{batch}", backend, tok_s, 100 * tok_s / limit))
    rows.append(Row(shape, f"prefill {plan.prefill_tokens}", backend, rt_prefill(core, plan)))
    if not plan.skip_offline:
        for n in plan.offline_requests:
            tok_s, retractions = rt_offline(core, n, plan)
            row = Row(shape, f"offline {n}x{plan.offline_new}", backend, tok_s)
            row.note, row.extra = f"{retractions} retractions", {"retractions": retractions}
            rows.append(row)
    return rows


# ---- transformers --------------------------------------------------------------------


def hf_model(raw: dict[str, Any], plan: Plan) -> Any:
    import transformers

    config = transformers.AutoConfig.for_model(**raw)
    with torch.device(plan.device):  # initialise on the device: the 8B on CPU is slow
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=resolve_dtype(plan.dtype)
        )
    return model.to(plan.device).eval()


def hf_decode(model: Any, batch: int, plan: Plan) -> tuple[float, float]:
    """Like :func:`rt_decode`: a static-cache greedy loop over ``model(...)``."""
    import transformers

    device = torch.device(plan.device)
    vocab = model.config.vocab_size
    rng = random.Random(batch)
    prompts = [random_prompt(rng, plan.prompt_len, vocab) for _ in range(batch)]
    ids = torch.tensor(prompts, device=device)
    cache_len = plan.prompt_len + plan.warmup + plan.steps + 1
    cache = transformers.StaticCache(config=model.config, max_cache_len=cache_len)
    # transformers 5.24 renamed forward's past_key_values to cache (the old name warns)
    params = inspect.signature(model.forward).parameters
    kv = {"cache" if "cache" in params else "past_key_values": cache}
    with torch.inference_mode():
        out = model(
            input_ids=ids,
            **kv,
            use_cache=True,
            cache_position=torch.arange(plan.prompt_len, device=device),
            logits_to_keep=1,
        )
        tok = out.logits[:, -1].argmax(-1)

        def decode(first: int, count: int) -> None:
            nonlocal tok
            for pos in range(first, first + count):
                out = model(
                    input_ids=tok[:, None],
                    **kv,
                    use_cache=True,
                    cache_position=torch.tensor([pos], device=device),
                )
                tok = out.logits[:, -1].argmax(-1)

        decode(plan.prompt_len, plan.warmup)
        secs = timed(device, lambda: decode(plan.prompt_len + plan.warmup, plan.steps))
    return batch * plan.steps / secs, decode_context(plan)


def hf_prefill(model: Any, plan: Plan) -> float:
    device = torch.device(plan.device)
    vocab = model.config.vocab_size

    def run(seed: int) -> float:
        ids = torch.tensor(prefill_prompts(plan, vocab, seed), device=device)
        with torch.inference_mode():
            secs = timed(device, lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1))
        return ids.numel() / secs

    run(seed=1001)  # warm-up
    return run(seed=1002)


def bench_hf(shape: str, raw: dict[str, Any], plan: Plan, roofline: Roofline) -> list[Row]:
    model = hf_model(raw, plan)
    rows: list[Row] = []
    for batch in DECODE_BATCHES:
        tok_s, context = hf_decode(model, batch, plan)
        limit = roofline.limit(batch, context)
        rows.append(Row(shape, f"decode b{batch}", "transformers", tok_s, 100 * tok_s / limit))
    rows.append(
        Row(shape, f"prefill {plan.prefill_tokens}", "transformers", hf_prefill(model, plan))
    )
    return rows


# ---- the run -------------------------------------------------------------------------


def release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def bench_shape(shape: str, plan: Plan, bandwidth: float) -> list[Row]:
    raw = SHAPES[shape]
    cfg = ModelConfig.from_dict(raw)
    dtype, device = resolve_dtype(plan.dtype), torch.device(plan.device)
    roofline = Roofline(
        bandwidth,
        weight_bytes_read(cfg, dtype),
        KVPool.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype),
    )
    weights_mb, context = roofline.weight_bytes / 1e6, decode_context(plan)
    note = f"{weights_mb:,.1f} MB weights + {roofline.kv_bytes_per_token} B KV x {context:.0f} tok"
    rows = [
        Row(shape, f"roofline b{b}", "-", roofline.limit(b, context), note=f"{note} x b{b}")
        for b in DECODE_BATCHES
    ]
    for backend in plan.backends:
        rows += bench_rt(shape, cfg, backend, plan, roofline)
        release_memory(device)
    if not plan.skip_hf:
        rows += bench_hf(shape, raw, plan, roofline)
        release_memory(device)
    return rows


def format_table(rows: Sequence[Row]) -> str:
    lines = [
        "| workload | backend | tok/s | % of limit | note |",
        "|---|---|---:|---:|---|",
    ]
    for r in rows:
        tok_s = f"{r.tok_s:,.0f}" if r.tok_s is not None else r.note
        pct = f"{r.pct_of_limit:.1f}" if r.pct_of_limit is not None else ""
        note = r.note if r.tok_s is not None else ""
        lines.append(f"| {r.shape} {r.workload} | {r.backend} | {tok_s} | {pct} | {note} |")
    return "\n".join(lines)


def device_error(device: str) -> str | None:
    """Why ``device`` cannot run, or None."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        return (
            f"gpu_bench: --device {device} but torch {torch.__version__} sees no CUDA device "
            f"(built for CUDA {torch.version.cuda}); run it on a GPU machine, or pass "
            "--device cpu or --smoke"
        )
    return None


def make_plan(args: argparse.Namespace) -> Plan:
    if args.smoke:
        return Plan(
            device=args.device or "cpu",
            dtype=args.dtype or "float32",
            shapes=("tiny",),
            backends=("torch",),
            steps=args.steps or 4,
            warmup=2,
            prompt_len=16,
            prefill_tokens=256,
            prefill_prompt_len=64,
            offline_requests=(8, 16),
            offline_prompt=(8, 32),
            offline_new=8,
            context_length=512,
            max_total_tokens=8192,
            copy_mib=16,
            threads=args.threads or 1,  # small CPU ops: more threads only contend
            skip_hf=args.skip_hf,
            skip_offline=args.skip_offline,
        )
    return Plan(
        device=args.device or "cuda",
        dtype=args.dtype or "bfloat16",
        shapes=tuple(args.shapes.split(",")),
        backends=tuple(args.backends.split(",")),
        steps=args.steps or 64,
        max_total_tokens=args.max_total_tokens,
        mem_fraction=args.mem_fraction,
        threads=args.threads,
        skip_hf=args.skip_hf,
        skip_offline=args.skip_offline,
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--device", default=None, help="default: cuda (cpu with --smoke)")
    parser.add_argument(
        "--dtype", default=None, choices=["bfloat16", "float16", "float32"],
        help="default: bfloat16 (float32 with --smoke)",
    )  # fmt: skip
    parser.add_argument("--shapes", default="1b,8b", help="comma-separated: 1b, 8b")
    parser.add_argument(
        "--backends",
        default="torch,triton,triton-eager,triton-sync,triton-deterministic,flashinfer",
    )
    parser.add_argument("--steps", type=int, default=None, help="timed decode steps (64)")
    parser.add_argument("--max-total-tokens", type=int, default=None, help="rt's KV pool")
    parser.add_argument(
        "--mem-fraction", type=float, default=None, help="without the above (engine default)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch's intra-op threads")
    parser.add_argument("--skip-hf", action="store_true", help="no transformers rows")
    parser.add_argument("--skip-offline", action="store_true", help="no offline rows")
    parser.add_argument("--smoke", action="store_true", help="a tiny model on CPU, in seconds")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    unknown = [s for s in args.shapes.split(",") if s not in ("1b", "8b")]
    if unknown:
        parser.error(f"--shapes: expected 1b and/or 8b, got {', '.join(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args)
    error = device_error(plan.device)
    if error is not None:
        print(error, file=sys.stderr)
        return DEVICE_ERROR_EXIT
    device = torch.device(plan.device)
    threads = torch.get_num_threads()
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    try:
        bandwidth = copy_bandwidth(device, plan.copy_mib)
        rows: list[Row] = []
        for shape in plan.shapes:
            rows += bench_shape(shape, plan, bandwidth)
    finally:
        torch.set_num_threads(threads)  # main() may run inside another program (the tests)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}, {plan.dtype}; copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + written)")
    print(format_table(rows))
    if not plan.skip_hf:
        print("(transformers: eager, sdpa, StaticCache; a hand-written greedy loop)")
    if args.json is not None:
        report = {
            "device": name,
            "dtype": plan.dtype,
            "copy_bandwidth_bytes_per_s": bandwidth,
            "plan": asdict(plan),
            "rows": [asdict(r) for r in rows],
        }
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

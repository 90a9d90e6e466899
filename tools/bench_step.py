"""Where one decode step of the engine core goes: build the batch, forward, sample.

    .venv/bin/python tools/bench_step.py [--model-path DIR] [--dtype float32] \
        [--batch 1] [--prompt-len 64] [--steps 100] [--threads 1] [--torch-compile] [--json]

Runs rt's ``EngineCore`` alone (no actors, no rings) on the shipped model by
default: prefills ``--batch`` random prompts, takes 10 decode steps to warm
up, then times ``--steps`` steps whole, and as many again with the three
parts timed apart. Seeded sampling at temperature 1, as a chat client asks.

``--torch-compile`` compares instead: an eager core and one with
``torch_compile=True`` (compiled for this batch size first), both in this
process, their decode steps timed in alternating rounds of ``--steps`` (the
machine's load moves both alike); it prints each one's median and the ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any


def started(args: argparse.Namespace, budget: int, **options: Any) -> Any:
    """A core holding ``--batch`` requests of ``budget`` tokens, prefilled and warmed up."""
    import torch

    from rt.assets import default_model_path
    from rt.gpu import EngineConfig, EngineCore, SamplingParams

    torch.set_num_threads(args.threads)
    path = args.model_path or str(default_model_path())
    config = EngineConfig(model_path=path, dtype=args.dtype, max_total_tokens=1 << 15, **options)
    core = EngineCore(config)
    rng, vocab = random.Random(0), core.model_config.vocab_size
    for i in range(args.batch):
        prompt = [rng.randrange(3, min(200, vocab)) for _ in range(args.prompt_len)]
        params = SamplingParams(max_new_tokens=budget, ignore_eos=True, temperature=1.0, seed=i)
        core.add_request(f"r{i}", prompt, params)
    for _ in range(11):  # the prefill, then a warm-up
        core.step()
    return core


def compare(args: argparse.Namespace, rounds: int = 8) -> dict[str, Any]:
    budget = 12 + rounds * args.steps
    eager = started(args, budget)
    compiled = started(args, budget, torch_compile=True, torch_compile_max_bs=args.batch)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(rounds):
        for name, core in (("eager", eager), ("compiled", compiled)):
            start = time.perf_counter()
            for _ in range(args.steps):
                core.step()
            times[name].append(1e3 * (time.perf_counter() - start) / args.steps)
    assert compiled.runner.compiled.runs >= rounds * args.steps
    ms = {name: statistics.median(values) for name, values in times.items()}
    return {
        "dtype": args.dtype,
        "batch": args.batch,
        "threads": args.threads,
        "eager_step_ms": ms["eager"],
        "compiled_step_ms": ms["compiled"],
        "ratio": ms["compiled"] / ms["eager"],
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import rt.gpu.engine as core_module

    core = started(args, 10 + 2 * args.steps + 1)
    start = time.perf_counter()
    for _ in range(args.steps):
        core.step()
    step = (time.perf_counter() - start) / args.steps

    parts = {"build": 0.0, "forward": 0.0, "sample": 0.0}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                parts[name] += time.perf_counter() - t

        return run

    runner = core.runner
    runner.build_batch = timed("build", runner.build_batch)
    runner.forward = timed("forward", runner.forward)
    # the draw (on the CPU no overlap: its result is read back at once, a list's worth)
    sample = core_module.sample_async
    core_module.sample_async = timed("sample", sample)
    try:
        for _ in range(args.steps):
            core.step()
    finally:
        core_module.sample_async = sample
    ms = {name: 1e3 * total / args.steps for name, total in parts.items()}
    return {
        "dtype": args.dtype,
        "batch": args.batch,
        "threads": args.threads,
        "step_ms": 1e3 * step,
        **{f"{name}_ms": value for name, value in ms.items()},
        "tokens_per_s": args.batch / step,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-path", default=None, help="default: the shipped model")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    parser.add_argument(
        "--torch-compile", action="store_true", help="compare eager with torch_compile=True"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out = compare(args) if args.torch_compile else measure(args)
    if args.json:
        print(json.dumps(out))
        return
    if args.torch_compile:
        print(
            f"{out['dtype']} batch {out['batch']} ({out['threads']} thread(s)): "
            f"eager {out['eager_step_ms']:.2f} ms, compiled {out['compiled_step_ms']:.2f} ms "
            f"a step: {out['ratio']:.2f}x"
        )
        return
    print(
        f"{out['dtype']} batch {out['batch']} ({out['threads']} thread(s)): "
        f"step {out['step_ms']:.2f} ms ({out['tokens_per_s']:.0f} tok/s); "
        f"build {out['build_ms']:.2f}, forward {out['forward_ms']:.2f}, "
        f"sample {out['sample_ms']:.2f} ms"
    )


if __name__ == "__main__":
    main()

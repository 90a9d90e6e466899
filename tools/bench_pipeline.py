"""The runtime's own overhead, measured through the whole pipeline with a null model.

With ``load_format="null"`` the scheduler skips the forward pass and emits
fixed tokens, so what is measured is rt: the frontend, the rings, the
tokenizer, the scheduler's loop, the detokenizer, and back to the caller.

  * tokens/s through the pipeline with 1 and 256 concurrent streams;
  * latency from the scheduler's step to the caller's chunk (p50/p99);
  * the tokenizer's dynamic batching: requests/s at concurrency 64, with
    batching (up to 64 per call) and without (1 per call), in one run; and the
    tokenizer worker's own work (64 requests per call vs 1), in this process.

    python tools/bench_pipeline.py [--model-path DIR] [--tokens 64] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
import trio

import rt
from rt.chaos.cli import at_least

PROMPT = "The quick brown fox jumps over the lazy dog, and then it sleeps."


async def streaming(engine: rt.Engine, concurrency: int, tokens: int) -> dict[str, float]:
    latencies: list[float] = []
    total = 0

    async def one(i: int) -> None:
        nonlocal total
        async for chunk in engine.stream(
            f"{PROMPT} {i}", max_new_tokens=tokens, ignore_eos=True, temperature=0.0
        ):
            if chunk.stepped_at:  # 0.0: replayed, no step behind it
                latencies.append(time.monotonic() - chunk.stepped_at)
            total += len(chunk.output_ids)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(concurrency):
            nursery.start_soon(one, i)
    elapsed = time.perf_counter() - start
    lat = np.array(latencies) * 1e3
    return {
        "tokens_per_s": total / elapsed,
        "step_to_chunk_p50_ms": float(np.percentile(lat, 50)),
        "step_to_chunk_p99_ms": float(np.percentile(lat, 99)),
    }


async def requests_per_s(engine: rt.Engine, concurrency: int, count: int) -> float:
    pending = iter(range(count))

    async def worker() -> None:
        for i in pending:
            await engine.generate(f"{PROMPT} request number {i}", max_new_tokens=1)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return count / (time.perf_counter() - start)


def tokenizer_core(model_path: str | None, count: int) -> dict[str, float]:
    """The tokenizer worker's own work, in this process: 64 requests per call vs 1."""
    from rt.config import EngineOptions
    from rt.messages import GenerateRequest
    from rt.tok.core import TokenizerCore
    from rt.tok.load import load_tokenizer

    opts = EngineOptions.build(model_path=model_path)
    context, vocab = opts.model_limits()
    core = TokenizerCore(load_tokenizer(opts.resolved_tokenizer_path()), context, vocab)
    reqs = [GenerateRequest(str(i), text=f"{PROMPT} request number {i}") for i in range(count)]
    out = {}
    for label, size in (("batched", 64), ("unbatched", 1)):
        start = time.perf_counter()
        for i in range(0, count, size):
            core.process(reqs[i : i + size])
        out[f"tokenizer_core_{label}_req_per_s"] = count / (time.perf_counter() - start)
    return out


async def bench(model_path: str | None, tokens: int, quick: bool, rounds: int) -> dict[str, Any]:
    common: dict[str, Any] = dict(
        load_format="null", max_total_tokens=1 << 20, max_running_requests=512
    )
    out: dict[str, Any] = {}
    async with rt.open_engine(model_path, **common) as engine:
        await streaming(engine, 4, 4)  # warm up
        for concurrency in (1, 64 if quick else 256):
            runs = [await streaming(engine, concurrency, tokens) for _ in range(rounds)]
            out[f"streams_{concurrency}"] = {
                k: statistics.median(r[k] for r in runs) for k in runs[0]
            }
    count = 300 if quick else 2000
    for label, batch in (("batched", 64), ("unbatched", 1)):
        async with rt.open_engine(model_path, tokenizer_batch_size=batch, **common) as engine:
            await requests_per_s(engine, 8, 16)  # warm up
            rates = [await requests_per_s(engine, 64, count) for _ in range(rounds)]
            out[f"tokenizer_{label}_req_per_s"] = statistics.median(rates)
    out["tokenizer_batching_speedup"] = (
        out["tokenizer_batched_req_per_s"] / out["tokenizer_unbatched_req_per_s"]
    )
    out.update(tokenizer_core(model_path, 640 if quick else 6400))
    out["tokenizer_core_batching_speedup"] = (
        out["tokenizer_core_batched_req_per_s"] / out["tokenizer_core_unbatched_req_per_s"]
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="default: the shipped model")
    parser.add_argument("--tokens", type=at_least(1), default=64, help="new tokens per stream")
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = trio.run(bench, args.model_path, args.tokens, args.quick, args.rounds)
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        if isinstance(value, dict):
            print(
                f"{key:28} {value['tokens_per_s']:10.0f} tok/s   step→chunk "
                f"p50 {value['step_to_chunk_p50_ms']:.2f} ms  p99 {value['step_to_chunk_p99_ms']:.2f} ms"
            )
        else:
            print(f"{key:28} {value:10.2f}")


if __name__ == "__main__":
    main()

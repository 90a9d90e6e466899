"""Where a first token's time goes: requests one at a time through the trio API.

Each request's time to first token, cut at the clocks the pipeline already
keeps (``time.monotonic()``, shared by every process of the machine):

  * submit → admitted: the frontend, the tokenizer, two ring hops and the
    scheduler's loop up to the step that takes the request in (``queue_time``);
  * admitted → stepped: that step (the prefill), and with overlap scheduling
    the next step's launch, which reads its token back (``Chunk.stepped_at``);
  * stepped → front: the scheduler's frame to the detokenizer, the text, and
    the frame to the frontend (``time_to_first_token``);
  * front → caller: the frontend handing the chunk to the reader.

Prompts are random token ids (no prefix cache hits), one request in flight at
a time, as a client at concurrency 1 sends them. Prints p50 / p99 / mean (ms)
of the whole and of each part.

    python tools/bench_ttft.py [--model-path DIR] [--requests 64] [--input-len 64] \
        [--torch-threads 1] [--rt-option device=cuda --rt-option dtype=bfloat16 ...] [--json]

``--torch-threads 1`` is how docs/benchmarks.md measured it on a shared CPU (torch's
own threads beside the actors' made the figures tens of times worse). Ctrl-C stops
the run: the figures so far, then exit 130.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import trio

import rt
from rt.chaos.cli import at_least

# its siblings: launch_servers, serving_figures
sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_servers import parse_options
from serving_figures import describe

PARTS = ("submit→admitted", "admitted→stepped", "stepped→front", "front→caller")


async def one(engine: rt.Engine, ids: list[int], new_tokens: int) -> dict[str, float] | None:
    async with engine.stream(ids, max_new_tokens=new_tokens, ignore_eos=True) as stream:
        # the stream is built (the request checked): its first read submits it, and the
        # frontend's clock for the request (Meta's times) starts microseconds after this
        start = time.monotonic()
        first = await stream.__anext__()
        got = time.monotonic()
        meta = stream.meta
        async for _ in stream:
            pass
    if meta is None or meta.queue_time is None or meta.time_to_first_token is None:
        return None
    admitted = start + meta.queue_time
    front = start + meta.time_to_first_token
    return {
        "ttft": got - start,
        PARTS[0]: meta.queue_time,
        PARTS[1]: first.stepped_at - admitted,
        PARTS[2]: front - first.stepped_at,
        PARTS[3]: got - front,
    }


async def bench(args: argparse.Namespace, options: dict[str, Any]) -> dict[str, Any]:
    rng = random.Random(args.seed)
    async with rt.open_engine(args.model_path, **options) as engine:
        vocab = engine.vocab_size
        rows = []
        for i in range(args.warmup + args.requests):
            ids = [rng.randrange(3, vocab) for _ in range(args.input_len)]
            try:
                row = await one(engine, ids, args.output_len)
            except rt.errors.EngineShutdownError:
                break  # (Ctrl-C: the engine drains)
            if row is not None and i >= args.warmup:
                rows.append(row)
            if engine.stopped_by:
                break
    out: dict[str, Any] = {"requests": len(rows), "input_len": args.input_len, "options": options}
    out["interrupted"] = engine.stopped_by
    for key in ("ttft", *PARTS):
        out[key] = describe([r[key] for r in rows])  # ms: mean, p50, p99
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="default: the shipped model")
    parser.add_argument("--requests", type=at_least(1), default=64)
    parser.add_argument("--warmup", type=at_least(0), default=4, help="requests first, not counted")
    parser.add_argument("--input-len", type=at_least(1), default=64)
    parser.add_argument("--output-len", type=at_least(1), default=2)
    parser.add_argument("--torch-threads", type=at_least(1), help="torch's threads per process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rt-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an engine option for open_engine: device=cuda, load_format=null",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    options = parse_options(args.rt_option)
    if args.torch_threads:
        options.setdefault("torch_threads", args.torch_threads)
    try:
        result = trio.run(bench, args, options)
    except rt.errors.RtError as err:  # (a model that does not load, an option refused)
        print(f"bench_ttft: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # (before the engine took the signal: nothing measured)
        print("bench_ttft: interrupted (SIGINT)", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result))
    else:
        said = f"; {options}" if options else ""
        print(f"{result['requests']} requests of {args.input_len} tokens, one at a time{said}")
        print(f"{'':18} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
        for key in ("ttft", *PARTS):
            row = result[key]
            if row is None:  # (none measured: stopped in the warm-up)
                print(f"{key:18} {'-':>8} {'-':>8} {'-':>8}")
            else:
                print(f"{key:18} {row['p50']:8.2f} {row['p99']:8.2f} {row['mean']:8.2f}")
    if result["interrupted"]:
        print(f"bench_ttft: interrupted ({result['interrupted']})", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

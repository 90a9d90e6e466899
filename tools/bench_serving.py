"""Load generator for OpenAI-compatible servers: rt-serve, `transformers serve`, any other.

N requests with given input and output lengths (fixed, or uniform in
[ratio × len, len]), sent at a request rate (Poisson arrivals) and/or at most
C at a time, every one streamed, over one or more transports:

  * openai: POST /v1/completions with "stream": true (SSE); any server;
  * ws:     rt's GET /ws, every request on one connection (rt.client);
  * engine: rt's trio API in this process (rt.open_engine), no HTTP at all:
            openai or ws against engine is what the front costs.

Reports request throughput, input and output token throughput, TTFT,
inter-token latency (ITL: the gap between two chunks that carry tokens),
TPOT ((e2e - TTFT) / (output tokens - 1), per request) and e2e latency, as
mean, p50 and p99; and step→client where the chunks say when the scheduler
produced them (the engine's do; a server's SSE chunk or WebSocket frame does
if it carries ``stepped_at``, a time.monotonic() of the server's machine).

Every run (a backend at a concurrency) sends prompts of its own, drawn from
the seed and the run's place in the list, so that no run finds its prompts in
a prefix cache an earlier run filled (the servers compared get the same
prompts for the same run). ``cached %`` is the share of prompt tokens the
server reports as cached (OpenAI's ``usage.prompt_tokens_details``; ``-``
where it says nothing): for rt ~1 token a request, the BOS they all share.

    python tools/bench_serving.py --launch rt,transformers --max-concurrency 1,16,64
    python tools/bench_serving.py --url http://127.0.0.1:30000 --request-rate 8 --json
    python tools/bench_serving.py --launch rt --backend openai,ws,engine --max-concurrency 256 \\
        --rt-option load_format=null --rt-option max_running_requests=512

``--launch`` starts each server on a free port of 127.0.0.1 and stops it after;
``transformers serve`` needs ``pip install fastapi uvicorn accelerate``. On a
small shared machine, ``--torch-threads 1`` keeps torch's threads from spinning
against each other (it sets OMP_NUM_THREADS for every process the tool starts).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

# its siblings: launch_servers, serving_figures, serving_requests
sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_servers import (
    LAUNCHABLE,
    client_pinned,
    free_port,
    launched,
    parse_options,
    served_model,
    server_command,
)
from serving_figures import Record, summarize
from serving_requests import (
    RequestSpec,
    Workload,
    arrival_offsets,
    completion_body,
    make_requests,
    sse_data,
)

from rt.errors import RtError

# ---- the transports (thin trio shells) --------------------------------------------

Send = Callable[[RequestSpec], Awaitable[Record]]


def _stepped(record: Record, obj: dict[str, Any]) -> None:
    stepped_at = obj.get("stepped_at")
    if isinstance(stepped_at, int | float) and stepped_at > 0:
        record.step_to_client.append(time.monotonic() - stepped_at)


async def openai_request(
    http: Any, url: str, body: dict[str, Any], spec: RequestSpec, count: Callable[[str], int]
) -> Record:
    import httpx

    record = Record(spec.prompt_len, start=time.perf_counter())
    texts: list[str] = []
    usage: dict[str, Any] | None = None
    try:
        async with http.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                said = (await response.aread())[:300].decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {said}"
                return record
            done = False
            async for line in response.aiter_lines():
                # read to the body's end, past [DONE]: a response left unread closes its
                # connection, and every request then paid for a new one (both servers)
                data = None if done else sse_data(line)
                if data is None:
                    continue
                if data == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    record.error = f"error event: {str(chunk['error'])[:300]}"
                    return record
                text = "".join(c.get("text") or "" for c in chunk.get("choices") or ())
                if text:
                    record.chunk(time.perf_counter())
                    texts.append(text)
                    _stepped(record, chunk)
                usage = chunk.get("usage") or usage
    except httpx.HTTPError as err:
        record.error = f"{type(err).__name__}: {err}"
        return record
    record.finish(time.perf_counter())
    if usage:
        record.output_tokens = int(usage["completion_tokens"])
        record.prompt_tokens = int(usage.get("prompt_tokens", record.prompt_tokens))
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            record.cached_tokens = int(details["cached_tokens"])
    else:  # no usage: count what came back with this tool's tokenizer
        record.output_tokens = count("".join(texts))
    return record


async def ws_request(client: Any, spec: RequestSpec) -> Record:
    from rt import errors

    record = Record(spec.prompt_len, start=time.perf_counter())
    params = {"max_new_tokens": spec.output_len, "ignore_eos": True, "temperature": 0.0}
    stream = client.stream(spec.prompt, sampling_params=params)
    try:
        async for delta in stream:
            if delta.output_ids:
                record.chunk(time.perf_counter())
                record.output_tokens += len(delta.output_ids)
                _stepped(record, delta.frame)
    except errors.RtError as err:
        record.error = f"{type(err).__name__}: {err}"
        return record
    record.finish(time.perf_counter())
    meta = stream.meta_info or {}
    record.prompt_tokens = int(meta.get("prompt_tokens", spec.prompt_len))
    if meta.get("cached_tokens") is not None:
        record.cached_tokens = int(meta["cached_tokens"])
    return record


async def engine_request(engine: Any, spec: RequestSpec) -> Record:
    from rt import errors

    record = Record(spec.prompt_len, start=time.perf_counter())
    try:  # (a request the engine refuses raises here, as the stream is made)
        stream = engine.stream(
            spec.prompt, max_new_tokens=spec.output_len, ignore_eos=True, temperature=0.0
        )
        async for chunk in stream:
            if chunk.output_ids:
                record.chunk(time.perf_counter())
                record.output_tokens += len(chunk.output_ids)
                if chunk.stepped_at:  # 0.0: replayed, no step behind it
                    record.step_to_client.append(time.monotonic() - chunk.stepped_at)
    except errors.RtError as err:
        record.error = f"{type(err).__name__}: {err}"
        return record
    record.finish(time.perf_counter())
    if stream.meta is not None:
        record.cached_tokens = stream.meta.cached_tokens
    return record


async def run_load(
    specs: Sequence[RequestSpec], send: Send, rate: float, max_concurrency: int | None, seed: int
) -> dict[str, Any]:
    """Send every spec at its arrival time, at most ``max_concurrency`` at once."""
    import trio

    offsets = arrival_offsets(len(specs), rate, random.Random(seed))
    limit = trio.Semaphore(max_concurrency) if max_concurrency else None
    records: list[Record | None] = [None] * len(specs)

    async def one(i: int, start: float) -> None:
        await trio.sleep_until(start + offsets[i])
        if limit is None:
            records[i] = await send(specs[i])
            return
        async with limit:
            records[i] = await send(specs[i])

    began = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(len(specs)):
            nursery.start_soon(one, i, trio.current_time())
    return summarize([r for r in records if r is not None], time.perf_counter() - began)


# ---- one server or engine, every concurrency ----------------------------------------


async def bench_http(
    args: argparse.Namespace,
    url: str,
    backend: str,
    body: Callable[[RequestSpec], Any],
    loads: Sequence[Workload],
) -> list[dict[str, Any]]:
    import httpx

    from rt.client import connect

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    # One client of one kept-alive connection per request in flight: a shared pool of
    # N connections looks at every idle one (a system call each) for every request,
    # which at concurrency 64 made this tool its own bottleneck.
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    free: list[httpx.AsyncClient] = []
    made: list[httpx.AsyncClient] = []
    out = []
    try:
        for concurrency, load in zip(args.max_concurrency, loads, strict=True):
            if backend == "ws":
                async with connect(url, api_key=args.api_key) as client:
                    out.append(await measure(load, partial(ws_request, client), concurrency))
                continue

            async def send(spec: RequestSpec) -> Record:
                if free:
                    http = free.pop()
                else:
                    http = httpx.AsyncClient(timeout=None, limits=one, headers=headers)
                    made.append(http)
                try:
                    endpoint = f"{url}/v1/completions"
                    return await openai_request(http, endpoint, body(spec), spec, args.count_tokens)
                finally:
                    free.append(http)

            out.append(await measure(load, send, concurrency))
    finally:
        for http in made:
            await http.aclose()
    return out


async def bench_engine(
    args: argparse.Namespace, loads: Sequence[Workload]
) -> tuple[list[dict[str, Any]], str | None]:
    """The runs, and the signal that stopped the engine if one did (Ctrl-C: the
    engine drains, and what it refused after is no failure of the run's)."""
    import rt

    runs: list[dict[str, Any]] = []
    async with rt.open_engine(args.model_path, **args.rt_options) as engine:
        send = partial(engine_request, engine)
        for c, load in zip(args.max_concurrency, loads, strict=True):
            run = await measure(load, send, c)
            if engine.stopped_by:  # (cut short: its figures and refusals are no run's)
                break
            runs.append(run)
    return runs, engine.stopped_by


async def measure(load: Workload, send: Send, concurrency: int) -> dict[str, Any]:
    # A full batch first, of other prompts (no cache hits): the first steps of a
    # server at a batch size it has not run yet can be many times slower.
    warmup = load.warmup[: concurrency or None] if load.warmup_count is None else load.warmup
    warm = await run_load(warmup, send, math.inf, concurrency or None, load.seed)
    cpu = time.process_time()
    result = await run_load(load.specs, send, load.rate, concurrency or None, load.seed)
    # This process's CPU share of the run: near 100 %, the client is the bottleneck.
    # (For the engine backend it includes rt's frontend, which runs in this process.)
    result["client_cpu_percent"] = 100 * (time.process_time() - cpu) / result["duration_s"]
    result["warmup_failed"] = warm["failed"]
    result["errors"] += [f"(warm-up) {e}" for e in warm["errors"]]
    return {"max_concurrency": concurrency or None, "request_rate": load.rate, **result}


# ---- the command ------------------------------------------------------------------


def number(cast: Callable[[str], Any], least: float, above: bool = False) -> Callable[[str], Any]:
    """An argparse type: ``cast`` of the text, at least (or above) ``least``."""

    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < least or (above and value == least) or value != value:  # (NaN too)
            bound = f"> {least:g}" if above else f">= {least:g}"
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text}")
        return value

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:30000")
    where.add_argument("--launch", default="", help="servers to start in turn: rt,transformers")
    add("--backend", default="openai", help="openai, ws, engine or a list (openai,ws,engine)")
    add("--flavor", choices=["rt", "transformers", "plain"], help="default: from --launch, or rt")
    add("--model-path", help="to launch and tokenize with (default: rt's shipped model)")
    add("--model-name", help="the body's model (default: the first of GET /v1/models)")
    add("--rt-option", action="append", default=[], metavar="KEY=VALUE",
        help="an engine option, for open_engine and as an rt-serve flag: load_format=null")  # fmt: skip
    add("--extra-body", type=json.loads, default={}, help="JSON merged into each completion body")
    add("--api-key")
    add("--num-prompts", type=number(int, 1), default=200)
    add("--input-len", type=number(int, 1), default=128)
    add("--output-len", type=number(int, 1), default=64)
    add("--range-ratio", type=number(float, 0, above=True), default=1.0,
        help="lengths in [ratio × len, len]; 1: fixed")  # fmt: skip
    add("--request-rate", type=number(float, 0, above=True), default=math.inf,
        help="req/s, Poisson (default: inf)")  # fmt: skip
    add("--max-concurrency", default="0", help="a limit, or a list run in turn (1,16,64); 0: none")
    add(
        "--warmup",
        type=number(int, 0),
        help="requests before each run, not measured (default: conc)",
    )
    add("--torch-threads", type=number(int, 1),
        help="OMP_NUM_THREADS for the servers and actors started")  # fmt: skip
    add("--client-cpus", help="pin this tool to these CPUs ('0') while it sends HTTP load")
    add("--seed", type=int, default=0)
    add("--launch-timeout", type=number(float, 0, above=True), default=300.0)
    add("--json", action="store_true", help="print one JSON document")
    args = p.parse_args(argv)
    if args.range_ratio > 1:
        p.error(f"--range-ratio: expected a number in (0, 1], got {args.range_ratio:g}")
    try:
        args.max_concurrency = [int(c) for c in str(args.max_concurrency).split(",")]
    except ValueError:
        p.error(f"--max-concurrency: expected integers (1,16,64), got {args.max_concurrency!r}")
    if any(c < 0 for c in args.max_concurrency):
        p.error(f"--max-concurrency: expected limits >= 0 (0: none), got {args.max_concurrency}")
    args.backends = [b for b in args.backend.split(",") if b]
    args.launches = [k for k in args.launch.split(",") if k]
    args.rt_options = parse_options(args.rt_option)
    if not args.url and not args.launches and set(args.backends) - {"engine"}:
        p.error("--url or --launch is needed for the openai and ws backends")
    if unknown := set(args.backends) - {"openai", "ws", "engine"}:
        p.error(f"--backend takes openai, ws and engine, got {sorted(unknown)}")
    if unknown := set(args.launches) - set(LAUNCHABLE):
        p.error(f"--launch takes {', '.join(LAUNCHABLE)}, got {sorted(unknown)}")
    return args


def bench(args: argparse.Namespace) -> dict[str, Any]:
    import trio

    from rt.config import EngineOptions
    from rt.tok.load import load_tokenizer

    if args.torch_threads:  # inherited by launched servers and by the engine's actors
        os.environ["OMP_NUM_THREADS"] = str(args.torch_threads)
    model_path = EngineOptions.build(model_path=args.model_path).resolved_model_path()
    tokenizer = load_tokenizer(model_path)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    args.count_tokens = lambda text: len(encode(text))
    n, lens = args.num_prompts, (args.input_len, args.output_len, args.range_ratio)
    warm = args.warmup if args.warmup is not None else (max(args.max_concurrency) or n)

    def loads(first: int) -> list[Workload]:
        """Fresh prompts, of the same lengths, for each concurrency of one backend."""
        out = []
        for k in range(first, first + len(args.max_concurrency)):
            own = args.seed + 1_000_003 * (k + 1)
            specs = make_requests(n + warm, *lens, args.seed, vocab, encode, tokenizer.decode, own)
            out.append(Workload(specs[:n], specs[n:], args.warmup, args.request_rate, args.seed))
        return out

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    runs: list[dict[str, Any]] = []
    http_backends = [b for b in args.backends if b != "engine"]
    per_backend = [loads(b * len(args.max_concurrency)) for b in range(len(http_backends))]
    targets = [(k, None) for k in args.launches] or [("url", args.url)]
    for kind, url in targets if http_backends else []:
        with launch_or_attach(kind, url, model_path, args, headers) as base:
            flavor = args.flavor or ("transformers" if kind == "transformers" else "rt")
            model = args.model_name or (model_path if kind == "transformers" else None)
            model = model or served_model(base, headers)
            body = partial(completion_body, flavor, model, extra=args.extra_body)
            for backend, own in zip(http_backends, per_backend, strict=True):
                with client_pinned(args.client_cpus):
                    results = trio.run(bench_http, args, base, backend, body, own)
                runs += [{"server": url or kind, "backend": backend, **r} for r in results]
    interrupted = None
    if "engine" in args.backends:
        own = loads(len(http_backends) * len(args.max_concurrency))
        results, interrupted = trio.run(bench_engine, args, own)
        for result in results:
            runs.append({"server": "rt in-process", "backend": "engine", **result})
    skip = ("count_tokens", "rt_option", "backend", "launch")
    return {
        "interrupted": interrupted,
        "config": {k: v for k, v in vars(args).items() if k not in skip},
        "model_path": model_path,
        "cpus": os.cpu_count(),
        "loadavg_1m_after": os.getloadavg()[0],
        "runs": runs,
    }


@contextmanager
def launch_or_attach(
    kind: str, url: str | None, model_path: str, args: argparse.Namespace, headers: dict[str, str]
) -> Iterator[str]:
    if url is not None:
        yield url.rstrip("/")
        return
    port = free_port()
    command = server_command(kind, port, model_path, args.rt_options if kind == "rt" else {})
    with launched(command, port, args.launch_timeout, headers) as base:
        yield base


COLUMNS = [  # (heading, key, statistic or None, format)
    ("conc", "max_concurrency", None, "{}"),
    ("ok", "completed", None, "{}"),
    ("cached %", "cached_percent", None, "{:.0f}"),
    ("req/s", "request_throughput", None, "{:.2f}"),
    ("in tok/s", "input_throughput", None, "{:.0f}"),
    ("out tok/s", "output_throughput", None, "{:.0f}"),
    ("TTFT mean", "ttft_ms", "mean", "{:.1f}"),
    ("p50", "ttft_ms", "p50", "{:.1f}"),
    ("p99", "ttft_ms", "p99", "{:.1f}"),
    ("ITL mean", "itl_ms", "mean", "{:.1f}"),
    ("p50", "itl_ms", "p50", "{:.1f}"),
    ("p99", "itl_ms", "p99", "{:.1f}"),
    ("TPOT mean", "tpot_ms", "mean", "{:.1f}"),
    ("p50", "tpot_ms", "p50", "{:.1f}"),
    ("p99", "tpot_ms", "p99", "{:.1f}"),
    ("E2E mean", "e2e_ms", "mean", "{:.0f}"),
    ("p50", "e2e_ms", "p50", "{:.0f}"),
    ("p99", "e2e_ms", "p99", "{:.0f}"),
    ("step→cl p50", "step_to_client_ms", "p50", "{:.2f}"),
    ("p99", "step_to_client_ms", "p99", "{:.2f}"),
    ("client CPU%", "client_cpu_percent", None, "{:.0f}"),
]


def table(result: dict[str, Any]) -> str:
    """One row per run; latencies in ms."""
    rows = [["server", "backend", *(c[0] for c in COLUMNS)]]
    for run in result["runs"]:
        row = [str(run["server"]), run["backend"]]
        for _, key, stat, fmt in COLUMNS:
            value = run[key] if stat is None else (run[key] or {}).get(stat)
            row.append("-" if value is None else fmt.format(value))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    for run in result["runs"]:
        failed = f"{run['failed']} failed, {run.get('warmup_failed', 0)} in the warm-up"
        lines += [f"{run['server']} {run['backend']}: {failed}: {e}" for e in run["errors"]]
    return "\n".join(lines)


def finite(value: Any) -> Any:
    """``value`` with no infinity or NaN in it (None in their place): strict JSON
    (the default --request-rate, inf, made every --json output invalid)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """0; 1 when a run completed no request (a server that refuses, or is not there);
    130 when Ctrl-C stopped the in-process engine (the figures so far are printed)."""
    args = parse_args(argv)
    try:
        result = bench(args)
    except (RtError, OSError) as err:  # (a model that does not load, a port in use, …)
        print(f"bench_serving: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # (before the engine took the signal: no figures yet)
        print("bench_serving: interrupted (SIGINT)", file=sys.stderr)
        return 130
    print(json.dumps(finite(result), allow_nan=False) if args.json else table(result))
    for run in result["runs"]:
        if args.url and (run.get("cached_percent") or 0) > 50:  # (its prompts' seed: --seed)
            print(f"bench_serving: {run['server']} {run['backend']}: {run['cached_percent']:.0f} % "
                  "of the prompt tokens were cached: an earlier run with this --seed filled the "
                  "prefix cache; another --seed (or POST /flush_cache) measures cold prompts",
                  file=sys.stderr)  # fmt: skip
    if result.get("interrupted"):
        print(f"bench_serving: interrupted ({result['interrupted']})", file=sys.stderr)
        return 130
    if any(run["completed"] == 0 for run in result["runs"]):
        print("bench_serving: error: a run completed no request (see its errors)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What refusing (or taking) a large request body costs rt-serve's event loop.

Each case is a body of about ``--mib`` MiB built to be expensive to validate
(a long list of the wrong type, where a union tries each of its lists; many
unknown keys; a dict of bad values), parsed by ``rt.http.schemas.parse`` as
the server parses it, in a fresh process each: its peak memory growth and
its time, against the baseline of the same process parsing a valid body of
the same size (one long text), measured in the same run.

    .venv/bin/python tools/bench_validation.py --mib 8

It measures the ``rt`` of the directory it runs in (run it from a checkout's
root: another commit's, in a worktree, gives that commit's figures).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict, dataclass

CASES = {
    "prompt: a list of nulls": ("CompletionRequest", {"prompt": ["NULL"]}),
    "prompt: a list of ids (valid)": ("CompletionRequest", {"prompt": ["INT"]}),
    "stop: a list of ints": ("CompletionRequest", {"prompt": "x", "stop": ["INT"]}),
    "messages: a list of ints": ("ChatCompletionRequest", {"messages": ["INT"]}),
    "input_ids: a list of nulls": ("GenerateRequest", {"input_ids": ["NULL"]}),
    "sampling_params: a list of ints": (
        "GenerateRequest",
        {"text": "x", "sampling_params": ["INT"]},
    ),
    "sampling_params: empty objects": (
        "GenerateRequest",
        {"text": "x", "sampling_params": ["OBJ"]},
    ),
    "input_ids: empty lists": ("GenerateRequest", {"input_ids": ["LIST"]}),
    "logit_bias: bad values": ("CompletionRequest", {"prompt": "x", "logit_bias": "BIAS"}),
    "logit_bias: many entries": ("CompletionRequest", {"prompt": "x", "logit_bias": "MANY"}),
    "metadata: many entries": ("ChatCompletionRequest", {"messages": [], "metadata": "META"}),
    "unknown keys": ("CompletionRequest", "KEYS"),
    "text: one long string (baseline)": ("GenerateRequest", {"text": "TEXT"}),
}
BASELINE = "text: one long string (baseline)"

PROBE = """
import json, resource, sys, time
from rt.http import schemas
from rt.http.asgi import HTTPError
model, spec, size = json.loads(sys.argv[1])
def body(spec):
    many = size // 2  # "1," or "null," per item: about size bytes of items
    if spec == "KEYS":
        return "{" + ",".join(f'"k{i}":1' for i in range(size // 10)) + "}"
    text = json.dumps(spec)
    text = text.replace('["NULL"]', "[" + ",".join(["null"] * (many // 3)) + "]")
    text = text.replace('["INT"]', "[" + ",".join(["1"] * many) + "]")
    text = text.replace('["OBJ"]', "[" + ",".join(["{}"] * (many // 3 * 2)) + "]")
    text = text.replace('["LIST"]', "[" + ",".join(["[]"] * (many // 3 * 2)) + "]")
    text = text.replace('"BIAS"', "{" + ",".join(f'"{i}":null' for i in range(size // 12)) + "}")
    text = text.replace('"MANY"', "{" + ",".join(f'"{i}":1.0' for i in range(size // 14)) + "}")
    text = text.replace('"META"', "{" + ",".join(f'"{i}":""' for i in range(size // 12)) + "}")
    return text.replace('"TEXT"', json.dumps("a" * size))
data = body(spec).encode()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
try:
    schemas.parse(getattr(schemas, model), data)
    said = "taken"
except HTTPError as err:
    said = f"{err.status}: {str(err)[:60]}"
took = time.perf_counter() - start
grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps({"bytes": len(data), "seconds": took, "grew_mb": grew, "said": said}))
"""


@dataclass(frozen=True)
class Row:
    bytes: int
    seconds: float
    grew_mb: float
    said: str


def measure(model: str, spec: object, size: int) -> Row:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps([model, spec, size])],
        capture_output=True,
        text=True,
        check=True,
    )
    return Row(**json.loads(out.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--mib", type=float, default=8.0, help="each body's size (about)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args()
    size = int(args.mib * (1 << 20))
    rows = {name: measure(model, spec, size) for name, (model, spec) in CASES.items()}
    base = rows[BASELINE]
    if args.json:
        print(json.dumps({"mib": args.mib, "cases": {k: asdict(v) for k, v in rows.items()}}))
        return
    print(f"| body (~{args.mib:g} MiB) | MiB | peak growth MB | ms | vs baseline | answer |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for name, row in rows.items():
        print(
            f"| {name} | {row.bytes / (1 << 20):.1f} | {row.grew_mb:,.0f} | "
            f"{row.seconds * 1000:,.1f} | {row.seconds / max(base.seconds, 1e-6):.1f}× | "
            f"{row.said} |"
        )


if __name__ == "__main__":
    main()

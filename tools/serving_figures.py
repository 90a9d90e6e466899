"""What one request to a server did (its timings and token counts), and the
figures of a run of them: tools/bench_serving.py's record and summary, pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Record:
    """One request's timings (seconds, ``time.perf_counter``) and token counts."""

    prompt_tokens: int
    start: float = 0.0
    output_tokens: int = 0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)  # gaps between chunks that carry tokens
    latency: float = 0.0
    step_to_client: list[float] = field(default_factory=list)
    error: str | None = None
    cached_tokens: int | None = None  # prompt tokens found in the prefix cache, if told
    _last: float = 0.0

    def chunk(self, now: float) -> None:
        if self.ttft is None:
            self.ttft = now - self.start
        else:
            self.itl.append(now - self._last)
        self._last = now

    def finish(self, now: float) -> None:
        self.latency = now - self.start


def describe(seconds: Sequence[float]) -> dict[str, float] | None:
    """mean, p50 and p99 in milliseconds; None for no values."""
    if not seconds:
        return None
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    return {
        "mean": float(ms.mean()),
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
    }


def summarize(records: Sequence[Record], duration: float) -> dict[str, Any]:
    """The figures of one run. Throughputs count completed requests only."""
    ok = [r for r in records if r.error is None]
    duration = max(duration, 1e-9)
    prompts = sum(r.prompt_tokens for r in ok)
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    tpot = [
        (r.latency - r.ttft) / (r.output_tokens - 1)
        for r in ok
        if r.ttft is not None and r.output_tokens > 1
    ]
    return {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "input_throughput": sum(r.prompt_tokens for r in ok) / duration,
        "output_throughput": sum(r.output_tokens for r in ok) / duration,
        "total_input_tokens": sum(r.prompt_tokens for r in ok),
        "total_output_tokens": sum(r.output_tokens for r in ok),
        "cached_percent": 100 * sum(cached) / prompts if prompts and cached else None,
        "ttft_ms": describe([r.ttft for r in ok if r.ttft is not None]),
        "itl_ms": describe([gap for r in ok for gap in r.itl]),
        "tpot_ms": describe(tpot),
        "e2e_ms": describe([r.latency for r in ok]),
        "step_to_client_ms": describe([s for r in ok for s in r.step_to_client]),
        "errors": sorted({r.error for r in records if r.error})[:5],
    }

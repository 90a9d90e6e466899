"""Figures from a ledger, per fault and then per fault kind and per actor.

For each fault that fired (a ``fault`` event):

* detection latency: the fault → the supervisor knows (the actor's exit as
  the supervisor recorded it, else the first sample showing it down);
* time to restore: the fault → the first token of a request sent after it;
* back: the fault → the actor running again (a new incarnation);
* health gap: how long the health answer said "ok" while the actor was down,
  between the fault and its successor running (should be ~0; a hang is
  only known once the watchdog fires, so its gap is the watchdog's delay).

and the requests it failed: those in flight when it fired that did not
complete (cancellations and hostile requests left out), with their reasons,
so each fault kind and each actor has its own count of failures and why.

Plus the failed requests of the whole run, counted by reason.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rt.chaos.ledger import COMPLETED, Ledger, RequestRecord

METRICS = ("detect_s", "restore_s", "back_s", "health_gap_s")


@dataclass
class FaultFigures:
    fault: dict[str, Any]
    detect_s: float | None = None
    restore_s: float | None = None
    back_s: float | None = None
    health_gap_s: float | None = None
    failed: list[str] = field(default_factory=list)  # the reasons of the requests it failed


@dataclass
class Summary:
    n: int = 0
    values: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    failed: Counter[str] = field(default_factory=Counter)  # reason -> requests

    def add(self, f: FaultFigures) -> None:
        self.n += 1
        self.failed.update(f.failed)
        for name in METRICS:
            value = getattr(f, name)
            if value is not None:
                self.values[name].append(value)

    def stats(self, name: str) -> dict[str, float] | None:
        values = sorted(self.values.get(name, ()))
        if not values:
            return None
        return {
            "n": len(values),
            "p50": percentile(values, 50),
            "p99": percentile(values, 99),
            "max": values[-1],
        }


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest rank."""
    rank = max(math.ceil(p / 100 * len(sorted_values)), 1)
    return sorted_values[rank - 1]


def per_fault(ledger: Ledger) -> list[FaultFigures]:
    actors = ledger.of_kind("actor")
    health = ledger.of_kind("health")
    requests = list(ledger.requests().values())
    out = []
    for fault in ledger.of_kind("fault"):
        fig = FaultFigures(fault)
        t, name = fault["t"], fault["actor"]
        inc = max((e["incarnation"] for e in actors if e["name"] == name and e["t"] < t), default=1)
        mine = [e for e in actors if e["name"] == name and e["t"] >= t - 0.001]
        # (down: not one suspended by SIGSTOP, which /server_info tells at once: a stop's
        # detection is its restart's, the watchdog's)
        down = next((e for e in mine if e["state"] not in ("running", "suspended")), None)
        if down is not None and fault.get("crash", True):
            seen = down.get("exit_at", down["t"])
            fig.detect_s = max(seen - t, 0.0)
            back = next(
                (e for e in mine if e["state"] == "running" and e["incarnation"] > inc), None
            )
            if back is not None:
                fig.back_s = back["t"] - t
                fig.health_gap_s = ok_time(health, t, back["t"])
            fig.restore_s = first_token_after(requests, t)
        fig.failed = failed_by(requests, t)
        out.append(fig)
    return out


def failed_by(requests: Sequence[RequestRecord], t: float) -> list[str]:
    """The reasons of the requests in flight at ``t`` that failed (not hostile ones)."""
    out = []
    for r in requests:
        end = r.end
        if end is None or r.state in (COMPLETED, "cancelled") or r.spec.get("hostile"):
            continue
        if r.invoked_at <= t <= end["t"]:
            out.append(f"{r.state}: {(end.get('error') or '')[:120]}".rstrip(": "))
    return out


def first_token_after(requests: Sequence[RequestRecord], t: float) -> float | None:
    firsts = [
        r.first_token_at - t for r in requests if r.invoked_at >= t and r.first_token_at is not None
    ]
    return min(firsts) if firsts else None


def ok_time(health: Sequence[dict[str, Any]], t0: float, t1: float) -> float:
    """Seconds within [t0, t1] during which the last health answer was ok."""
    total, ok, since = 0.0, False, t0
    for e in health:
        if e["t"] <= t0:
            ok = e["ok"]
            continue
        if e["t"] >= t1:
            break
        if ok:
            total += e["t"] - since
        ok, since = e["ok"], e["t"]
    if ok:
        total += t1 - since
    return total


def summarize(figs: Sequence[FaultFigures]) -> dict[str, dict[str, Summary]]:
    """{"kind": {kind: Summary}, "actor": {actor: Summary}}."""
    by: dict[str, dict[str, Summary]] = {
        "kind": defaultdict(Summary),
        "actor": defaultdict(Summary),
    }
    for f in figs:
        by["kind"][f.fault["kind"]].add(f)
        by["actor"][f.fault["actor"]].add(f)
    return by


def failures(ledger: Ledger) -> Counter[str]:
    """Requests that did not complete, by state and reason (cancellations left out)."""
    out: Counter[str] = Counter()
    for rec in ledger.requests().values():
        if rec.state in (COMPLETED, "cancelled"):
            continue
        error = (rec.end or {}).get("error") or ""
        hostile = rec.spec.get("hostile")
        tag = f" [{hostile}]" if hostile else ""
        out[f"{rec.state}{tag}: {error[:120]}".rstrip(": ")] += 1
    return out

"""Checkers over a ledger (Jepsen's idea: a history, then checkers over it).

Each returns :class:`Finding` objects; an empty list is a pass.

* :func:`terminal`: every request reached exactly one terminal state (none
  lost, none hung, none ended twice);
* :func:`outcomes`: each reached the state it should: an innocent request
  completes (or is cancelled, when the client cancels it; or fails
  retryably, when it was in flight at shutdown), a poison one is refused or
  completes, an invalid one is refused with a 4xx, a fuzzed one gets no 5xx;
* :func:`streams`: no duplicated, missing or reordered text or ids in a
  stream: the deltas add up to the final output, the text is the decoded
  ids, and a completed output has its full length;
* :func:`against_reference` (float32): every greedy or seeded output equals
  the uninterrupted run's (a cancelled one, its prefix), and one that does
  not is looked up among the other requests' (a cross-request mix-up); the
  judge (rt/chaos/verdict.py) lets one pass that took the other side of an
  exact tie and is its own run's to within ``FLOAT32_TIE`` after it;
* :func:`no_splicing` (bfloat16): every token of every output is what a run
  conditioned on the tokens before it draws, to within bfloat16's rounding;
* :func:`engine`: the engine stayed up (no escalation, rt-serve exited 0),
  nothing leaked, and the driver saw no anomaly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from rt.chaos.ledger import (
    CANCELLED,
    COMPLETED,
    FAILED_FINAL,
    FAILED_RETRYABLE,
    TERMINAL,
    Ledger,
    RequestRecord,
)

MIXUP_MIN_TOKENS = 4


@dataclass(frozen=True)
class Finding:
    checker: str
    message: str
    req: int | None = None

    def __str__(self) -> str:
        who = f"request {self.req}: " if self.req is not None else ""
        return f"[{self.checker}] {who}{self.message}"


def terminal(ledger: Ledger) -> list[Finding]:
    out = []
    for rec in ledger.requests().values():
        if not rec.ends:
            out.append(Finding("terminal", "lost: no terminal state recorded", rec.index))
        elif len(rec.ends) > 1:
            states = [e["state"] for e in rec.ends]
            out.append(Finding("terminal", f"ended {len(rec.ends)} times: {states}", rec.index))
        elif rec.state not in TERMINAL:
            why = rec.ends[0].get("error") or ""
            out.append(Finding("terminal", f"{rec.state}: {why}".rstrip(": "), rec.index))
    return out


def outcomes(
    ledger: Ledger, poison: set[str], poison_faults: frozenset[int] = frozenset()
) -> list[Finding]:
    """``poison``: the markers whose poison fault was in the schedule that ran;
    ``poison_faults``: those faults' ids."""
    out = []
    for rec in ledger.requests().values():
        end = rec.end
        if end is None or end["state"] not in TERMINAL:
            continue  # terminal() reports it
        problem = _unexpected(rec.spec, end, poison)
        if problem and not _blamed_by_design(ledger, rec.invoked_at, end, poison_faults):
            out.append(Finding("outcome", problem, rec.index))
    return out


def _blamed_by_design(
    ledger: Ledger, invoked_at: float, end: dict[str, Any], poison_faults: frozenset[int]
) -> bool:
    """rt refuses a request that was in flight for ``max_crashes_per_request``
    crashes of one actor (the last with it alone): it cannot tell a schedule
    that kills the actor that often from a poison request. An innocent
    refused so is no finding when the schedule's crashes of that actor while
    it was in flight were enough to make it a suspect each time, and one of
    them at least was not a poison request's: a poison request crashes the
    actor only with it in hand, so an innocent it crashed was never alone
    (refusing it for those crashes alone is blaming the wrong request). A crash
    fired up to ``CRASH_SLACK_S`` before the request was sent counts: rt learns
    of it later (its exit, then the restart), and a request already in the
    table by then is in flight for it as far as rt can tell."""
    error = end.get("error") or ""
    match = _CRASH_REFUSAL.search(error)
    if end["state"] != FAILED_FINAL or match is None:
        return False
    needed, actor = int(match.group(1) or match.group(3)), match.group(2) or match.group(4)
    crashes = [
        e
        for e in ledger.of_kind("fault")
        if e.get("crash")
        and invoked_at - CRASH_SLACK_S <= e["t"] <= end["t"]
        and e["actor"].rstrip("0123456789") == actor
    ]
    return len(crashes) >= needed and any(e.get("id") not in poison_faults for e in crashes)


CRASH_SLACK_S = 1.0

# rt's two refusals of a suspected poison request (the tokenizer's, the scheduler's)
_CRASH_REFUSAL = re.compile(
    r"in hand when (\d+) (tokenizer) workers died|in flight for (\d+) (scheduler) crashes"
)


def _unexpected(spec: dict[str, Any], end: dict[str, Any], poison: set[str]) -> str | None:
    state, error = end["state"], end.get("error") or ""
    status = end.get("status")
    hostile = spec.get("hostile")
    if hostile == "invalid":
        refused = state == FAILED_FINAL and (
            status in (400, 413, 422) or "InvalidRequestError" in error
        )
        return None if refused else f"invalid request not refused with a 4xx: {state} {error}"
    if hostile == "fuzz":
        # refused: by the server with a 4xx, or by rt.client before it sent anything (a
        # value JSON cannot carry as given, such as 2**63: its InvalidRequestError, no status)
        refused = state == FAILED_FINAL and (
            (status is not None and status < 500)
            or (status is None and error.startswith("InvalidRequestError"))
        )
        return (
            None if state == COMPLETED or refused else f"fuzzed body got {state} {status} {error}"
        )
    if hostile == "poison" and spec.get("marker") in poison:
        return None if state in (COMPLETED, FAILED_FINAL) else f"poison request {state}: {error}"
    if state == COMPLETED:
        return None
    if state == CANCELLED and spec.get("cancel_after") is not None:
        return None
    if state == FAILED_RETRYABLE and end.get("at_shutdown"):
        return None
    if state == FAILED_FINAL and (status == 400 or not status) and "ContextOverflowError" in error:
        return None  # a long prompt with a long --max-tokens: rightly refused as too long
    return f"an innocent request {state}: {error}".rstrip(": ")


def _innocent_outputs(ledger: Ledger) -> Iterator[tuple[RequestRecord, dict[str, Any]]]:
    """Each request that was not hostile and ended with an output (completed or
    cancelled), with its end."""
    for rec in ledger.requests().values():
        end = rec.end
        ended = end is not None and end["state"] in (COMPLETED, CANCELLED)
        if ended and rec.spec.get("hostile") is None:
            assert end is not None
            yield rec, end


def streams(ledger: Ledger, decode: Callable[[Sequence[int]], str] | None) -> list[Finding]:
    out = []
    for rec, end in _innocent_outputs(ledger):
        out += _stream(rec, end, decode)
    for e in ledger.of_kind("anomaly"):
        out.append(Finding("stream", e["what"], e.get("req")))
    return out


def _stream(
    rec: RequestRecord, end: dict[str, Any], decode: Callable[[Sequence[int]], str] | None
) -> list[Finding]:
    ids, text = list(end.get("ids", [])), end.get("text", "")
    found = []
    if rec.deltas:
        if rec.delta_ids() != ids:
            found.append(
                Finding("stream", "the deltas' ids do not add up to the output", rec.index)
            )
        if rec.delta_text() != text:
            found.append(
                Finding("stream", "the deltas' text does not add up to the output", rec.index)
            )
    if end["state"] == COMPLETED and len(ids) != rec.spec["max_new_tokens"]:
        found.append(
            Finding(
                "stream",
                f"{len(ids)} tokens, expected {rec.spec['max_new_tokens']} (ignore_eos)",
                rec.index,
            )
        )
    if decode is not None and end["state"] == COMPLETED and decode(ids) != text:
        found.append(Finding("stream", "the text is not the decoded ids", rec.index))
    return found


def against_reference(ledger: Ledger, reference: dict[int, list[int]]) -> list[Finding]:
    """Float32: byte-identical to the uninterrupted run."""
    out = []
    for rec in ledger.requests().values():
        end, ref = rec.end, reference.get(rec.index)
        if end is None or ref is None or end["state"] not in (COMPLETED, CANCELLED):
            continue
        ids = list(end.get("ids", []))
        want = ref if end["state"] == COMPLETED else ref[: len(ids)]
        if ids == want:
            continue
        other = _owner(ids, reference, rec.index)
        if other is not None:
            out.append(Finding("mix-up", f"holds the output of request {other}", rec.index))
            continue
        at = next((i for i, (a, b) in enumerate(zip(ids, want, strict=False)) if a != b), None)
        where = (
            f"differs from token {at}" if at is not None else f"{len(ids)} vs {len(want)} tokens"
        )
        resumed = end.get("resumed_from")
        hint = f" (resumed from {resumed})" if resumed else ""
        out.append(
            Finding("reference", f"diverged from the fault-free run: {where}{hint}", rec.index)
        )
    return out


def _owner(ids: list[int], reference: dict[int, list[int]], me: int) -> int | None:
    """Another request whose reference this output follows, if any."""
    if len(ids) < MIXUP_MIN_TOKENS:
        return None
    for other, ref in reference.items():
        if other != me and ref[: len(ids)] == ids:
            return other
    return None


def engine(ledger: Ledger) -> list[Finding]:
    out = unexplained_exits(ledger)
    for e in ledger.of_kind("escalated"):
        out.append(Finding("engine", f"the engine gave up: {e['error']}"))
    for e in ledger.of_kind("server"):
        if e.get("code") not in (0, None):
            out.append(Finding("engine", f"rt-serve exited with {e['code']}: {e.get('tail', '')}"))
    for e in ledger.of_kind("stopped"):
        if "SIGKILL after" in (e.get("reason") or ""):  # the grace ran out
            out.append(Finding("leak", f"{e['name']} did not stop on SIGTERM: {e['reason']}"))
    for e in ledger.of_kind("leak"):
        out.append(Finding("leak", e["what"]))
    for e in ledger.of_kind("error"):
        out.append(Finding("harness", e["what"]))
    return out


# How far (in logits) a token may trail the draw of a run conditioned on the tokens
# before it: bfloat16 rounding at a near-tie (honest outputs: up to 0.03 on the
# default model), not a draw from another context.
SPLICE_TOLERANCE = 0.5

Margins = Callable[[RequestRecord, Sequence[int]], list[float]]  # (request, ids) → per token


def no_splicing(ledger: Ledger, margins_for: Margins) -> list[Finding]:
    """Bfloat16: every token of every innocent output is one that a run conditioned
    on the prompt and the tokens before it draws, to within :data:`SPLICE_TOLERANCE`
    (``margins_for``: :meth:`rt.chaos.reference.Replayer.margins`). Batched or not,
    resumed or not, greedy or seeded. A dead scheduler's tokens spliced to its
    successor's, where the two runs had diverged, put a token after a prefix its
    run never saw."""
    out = []
    for rec, end in _innocent_outputs(ledger):
        ids = list(end.get("ids", []))
        margins = margins_for(rec, ids)
        over = [j for j, m in enumerate(margins) if m > SPLICE_TOLERANCE]
        if not over:
            continue
        resumed = end.get("resumed_from")
        hint = f"; resumed from {resumed}" if resumed else ""
        out.append(
            Finding(
                "splice",
                f"token {over[0]} of {len(ids)} is not what a run conditioned on the tokens "
                f"before it draws: it trails that run's choice by {margins[over[0]]:.2f} "
                f"logits (tolerance {SPLICE_TOLERANCE}; {len(over)} such token(s){hint})",
                rec.index,
            )
        )
    return out


def unexplained_exits(ledger: Ledger) -> list[Finding]:
    """Every exit of an actor (its restart count going up) needs a fault aimed at
    it shortly before (a hang's exit comes a watchdog later); one fault explains
    one exit. An exit with none is a crash of rt's own: a crash loop, usually."""
    config = ledger.header().get("config", {})
    watchdog = float(config.get("engine", {}).get("watchdog_timeout", 30.0))
    window = 2 * watchdog + 10.0
    faults = sorted(ledger.of_kind("fault"), key=lambda e: e["t"])
    used: set[int] = set()
    seen: dict[str, int] = {}
    out = []
    for e in ledger.of_kind("actor"):
        name, restarts = e["name"], e.get("restarts", 0)
        before, seen[name] = seen.get(name, restarts), restarts
        for _ in range(restarts - before):
            at = e.get("exit_at", e["t"])
            cause = next(
                (i for i, f in enumerate(faults)
                 if i not in used and fnmatchcase(name, f["actor"]) and at - window <= f["t"] <= at + 0.5),
                None,
            )  # fmt: skip
            if cause is None:
                out.append(Finding("engine", f"{name} exited with no fault to explain it "
                                   f"at {at:.2f} s: {e.get('reason')}"))  # fmt: skip
            else:
                used.add(cause)
    return out

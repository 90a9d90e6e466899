"""The report: one screen of text, or the same as JSON."""

from __future__ import annotations

import shlex
from collections import Counter
from typing import Any

from rt.chaos import figures
from rt.chaos.campaign import Outcome, most_severe
from rt.chaos.ledger import TERMINAL
from rt.chaos.schedule import Fault

# (harness: its own trouble, which failed a run unseen on the checks line before)
CHECKERS = (
    "terminal",
    "outcome",
    "stream",
    "reference",
    "mix-up",
    "splice",
    "engine",
    "leak",
    "harness",
)
STATES = (*TERMINAL, "hung", "lost")
MAX_FINDINGS = 12


def summary(outcome: Outcome) -> dict[str, Any]:
    ledger, verdict, run = outcome.ledger, outcome.verdict, outcome.config.run
    requests = ledger.requests().values()
    states = Counter(r.state for r in requests)
    hostile = Counter(r.state for r in requests if r.spec.get("hostile"))
    restarts: dict[str, int] = {}
    before: dict[str, int] = {}  # (an attached server's actors may have restarted before)
    for e in ledger.of_kind("actor"):
        before.setdefault(e["name"], e["restarts"])
        restarts[e["name"]] = e["restarts"] - before[e["name"]]
    fired = ledger.of_kind("fault")
    by = figures.summarize(outcome.faults)
    failed = verdict.checkers()
    out: dict[str, Any] = {
        "seed": run.seed,
        "mode": run.mode,
        "dtype": run.engine.get("dtype", "float32"),
        "concurrency": run.concurrency,
        "seconds": round(outcome.seconds, 1),
        "passed": not verdict.failed,
        "inconclusive": inconclusive(outcome),
        "requests": {s: states.get(s, 0) for s in STATES} | {"sent": len(requests)},
        "hostile": dict(hostile),
        "checks": {c: ("FAIL" if c in failed else "pass") for c in CHECKERS},
        "outputs_checked": verdict.checked,
        "restarts": restarts,
        "faults_planned": len(outcome.schedule.faults),
        "faults_delays": sum(f.kind == "delay" for f in outcome.schedule.faults),
        "faults_fired": len(fired),
        "faults_never_fired": [f.describe() for f in never_fired(outcome)],
        "figures": {
            group: {key: _stats(s) for key, s in sorted(table.items())}
            for group, table in by.items()
        },
        "failures": dict(figures.failures(ledger).most_common()),
        "findings": [str(f) for f in verdict.findings],
        "schedule": [f.describe() for f in outcome.schedule.faults],
        "fired": [_fired(e) for e in fired],
        "ledger": outcome.ledger_path,
    }
    if outcome.shrunk is not None:
        ids = [f.id for f in outcome.shrunk.items]
        out["shrunk"] = {
            # as replayed: the kept crashes pinned to incarnations 1, 2, … again
            "faults": [f.describe() for f in outcome.schedule.subset(ids).faults],
            "ids": ids,
            "replays": outcome.shrunk.tries,
            "budget_ran_out": outcome.shrunk.exhausted,
            "replay": replay_command(outcome),
            "for": most_severe(outcome.verdict),
        }
    return out


def inconclusive(outcome: Outcome) -> bool:
    """Faults were planned, and none fired: a pass would say nothing of faults."""
    planned = [f for f in outcome.schedule.faults if f.kind != "delay"]
    return bool(planned) and not outcome.ledger.of_kind("fault")


def never_fired(outcome: Outcome) -> list[Fault]:
    """Planned faults the ledger has no firing of: their hit or phase never
    came (the actor had died before it). A delay writes no line when it
    fires, so it cannot be told apart and is left out."""
    fired = {e.get("id") for e in outcome.ledger.of_kind("fault")}
    return [f for f in outcome.schedule.faults if f.id not in fired and f.kind != "delay"]


def _stats(s: figures.Summary) -> dict[str, Any]:
    return (
        {"n": s.n}
        | {m: s.stats(m) for m in figures.METRICS}
        | {"failed": sum(s.failed.values()), "failed_reasons": dict(s.failed.most_common())}
    )


def _fired(e: dict[str, Any]) -> str:
    where = f" at {e['point']} hit {e['hit']}" if e.get("point") else ""
    return (
        f"{e['t']:.2f}s #{e.get('id')} {e['kind']} {e['actor']}{where} "
        f"({e.get('via')}, observed {e.get('observed')})"
    )


REPLACED = ("--seed", "--replay", "--faults")  # (the replay command sets its own)


def replay_command(outcome: Outcome) -> str:
    """The command that runs the shortest failing schedule again: the run's own
    command line (when the CLI gave it) with ``--replay SEED --faults IDS`` for its
    seed and fault options (a ``--schedule`` run keeps its file: a seed would draw
    another schedule)."""
    ids = ",".join(str(f.id) for f in outcome.shrunk.items) if outcome.shrunk else ""
    argv = outcome.config.argv
    if argv is None:
        return f"rt-chaos --replay {outcome.config.run.seed} --faults {ids or 'none'} (with the same options)"
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in REPLACED:
            skip = True  # (and its value)
        elif not arg.startswith(tuple(f"{name}=" for name in REPLACED)):
            kept.append(arg)
    seed = [] if outcome.config.plan is not None else ["--replay", str(outcome.config.run.seed)]
    return shlex.join(["rt-chaos", *kept, *seed, "--faults", ids or "none"])


def _ms(stats: dict[str, float] | None) -> str:
    if not stats:
        return "-"
    return "/".join(f"{stats[k] * 1000:.0f}" for k in ("p50", "p99", "max"))


def render(outcome: Outcome) -> str:
    s = summary(outcome)
    req = s["requests"]
    lines = [
        f"rt-chaos  seed {s['seed']}  {s['mode']}  {s['dtype']}  concurrency {s['concurrency']}  "
        f"{s['seconds']:.0f} s  faults planned {s['faults_planned']}, fired {s['faults_fired']} "
        f"times, {len(s['faults_never_fired'])} never"
        + (f" ({s['faults_delays']} delays, which leave no line)" if s["faults_delays"] else ""),
        f"requests  {req['sent']} sent: "
        + ", ".join(f"{k} {req[k]}" for k in STATES if req[k] or k in ("completed", "hung", "lost"))
        + (f"  (hostile: {s['hostile']})" if s["hostile"] else ""),
        "checks    "
        + "  ".join(f"{c} {v}" for c, v in s["checks"].items())
        + f"  ({s['outputs_checked']} outputs checked)",
        "restarts  " + ", ".join(f"{k} {v}" for k, v in sorted(s["restarts"].items())),
        "",
        f"{'p50/p99/max':<19}{'n':>4}  {'detect ms':>16}  {'restore ms':>16}  {'back ms':>16}  {'health ok while down ms':>24}  {'failed':>6}",
    ]
    for group in ("kind", "actor"):
        for key, stats in s["figures"].get(group, {}).items():
            lines.append(
                f"{group} {key:<14}{stats['n']:>4}  {_ms(stats['detect_s']):>16}  "
                f"{_ms(stats['restore_s']):>16}  {_ms(stats['back_s']):>16}  "
                f"{_ms(stats['health_gap_s']):>24}  {stats['failed']:>6}"
            )
    blamed = [
        f"  {group} {key}: {n} × {why}"
        for group in ("kind", "actor")
        for key, stats in s["figures"].get(group, {}).items()
        for why, n in stats["failed_reasons"].items()
    ]
    if blamed:
        lines += ["", "failed while a fault was in play (in flight as it fired)", *blamed[:8]]
    if s["failures"]:
        lines += ["", "failures", *[f"  {n} × {why}" for why, n in s["failures"].items()][:8]]
    if s["faults_never_fired"]:
        lines += ["", "never fired", *[f"  {f}" for f in s["faults_never_fired"][:6]]]
    if s["findings"]:
        lines += ["", f"FINDINGS ({len(s['findings'])})"]
        lines += [f"  {f}" for f in s["findings"][:MAX_FINDINGS]]
        if len(s["findings"]) > MAX_FINDINGS:
            lines.append(f"  … and {len(s['findings']) - MAX_FINDINGS} more (see --json)")
    if "shrunk" in s:
        sh = s["shrunk"]
        lines += ["", f"shortest schedule that still fails [{sh['for']}]: "
                      f"{len(sh['faults'])} of {s['faults_planned']} "
                      f"fault(s), {sh['replays']} replays"
                      + (" (budget ran out)" if sh["budget_ran_out"] else "")]  # fmt: skip
        lines += [f"  {f}" for f in sh["faults"]] or ["  (none: it fails without faults)"]
        lines.append(f"  {sh['replay']}")
    verdict = "FAIL" if not s["passed"] else "PASS"
    if s["passed"] and s["inconclusive"]:  # (a failure without faults stays one)
        verdict = "INCONCLUSIVE: no fault fired (more requests, or --duration, give them time)"
    lines += ["", f"ledger: {s['ledger']}", verdict]
    return "\n".join(lines)

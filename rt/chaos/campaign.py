"""A campaign: draw the schedule, run it, judge it, and shrink it if it failed.

The same seed draws the same schedule and the same requests, so a run is
replayed by its seed (``--replay SEED``), and a subset of its faults by
their ids (``--faults 3,7``). Shrinking replays subsets of the failing
schedule (:mod:`rt.chaos.shrink`); a subset fails when its run gets a
finding from one of the checkers the original run failed.

Two cuts come first, both from causality: a fault that never fired, or fired
only after the first finding the shrink keeps (a request's end, for a
finding about a request), cannot have caused it, so ddmin starts from the
faults that fired before it (when that subset still fails on replay, else
from all); and a run with a ``--duration`` is replayed only up to that
finding plus a margin (``REPLAY_MARGIN``), not for its whole length.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rt.chaos import figures
from rt.chaos.attach import Served, check_restart_limit, served, spaced
from rt.chaos.draw import draw_schedule
from rt.chaos.ledger import Ledger
from rt.chaos.reference import Replayer
from rt.chaos.run import RunConfig, run_once
from rt.chaos.schedule import Fault, Schedule, ScheduleConfig
from rt.chaos.shrink import Shrunk, ddmin
from rt.chaos.verdict import Judge, Verdict


@dataclass(frozen=True)
class CampaignConfig:
    run: RunConfig
    schedule: ScheduleConfig
    shrink_budget: int = 12  # replays at most
    only: tuple[int, ...] | None = None  # replay just these fault ids
    plan: Schedule | None = None  # run this schedule instead of drawing one
    argv: tuple[str, ...] | None = None  # the command line's (its replay command is built on it)


@dataclass
class Outcome:
    config: CampaignConfig
    schedule: Schedule
    ledger: Ledger
    ledger_path: str
    verdict: Verdict
    faults: list[figures.FaultFigures]
    seconds: float
    shrunk: Shrunk[Fault] | None = None
    shrunk_verdict: Verdict | None = None


def schedule_of(config: CampaignConfig) -> Schedule:
    schedule = config.plan or draw_schedule(config.run.seed, config.schedule)
    if config.only is not None:
        schedule = schedule.subset(config.only)
    return schedule


def model_path(run: RunConfig) -> str:
    path = run.engine.get("model_path")
    if path:
        return str(path)
    from rt.assets import default_model_path

    return str(default_model_path())


def fitted_to(config: CampaignConfig, server: Served) -> CampaignConfig:
    """``config`` for a run attached to ``server``: judged by its watchdog, not
    rt-chaos's ``--watchdog-timeout`` (which decides when a stop's restart must be
    explained by a fault, and how long a backlog's reader may stay stopped: 4 s
    found a stop its 30 s watchdog restarted "an exit with no fault to explain
    it"), and, when drawn, spread out to fit its restart limit (:func:`spaced`)."""
    engine = {**config.run.engine, "watchdog_timeout": server.watchdog_timeout}
    config = replace(config, run=replace(config.run, engine=engine))
    if config.plan is None:
        # a stop to continue is drawn under half a watchdog: under the server's too
        watchdog_s = min(config.schedule.watchdog_s, server.watchdog_timeout)
        schedule = replace(config.schedule, watchdog_s=watchdog_s)
        config = replace(config, schedule=spaced(schedule, server, config.run.duration))
    return config


async def campaign(
    config: CampaignConfig, say: Callable[[str], None] = lambda _: None, judge: Judge | None = None
) -> Outcome:
    server = None
    if config.run.mode == "attach" and config.run.url is not None:
        # a server started by someone else: what it serves, and how, decides how its
        # outputs are judged; its restart limit, how far apart the faults must be
        server = await served(config.run.url)
        fitted = fitted_to(config, server)
        if fitted.schedule != config.schedule:
            say(
                f"the server gives up past {server.max_restarts} restarts in "
                f"{server.restart_window:g} s: {fitted.schedule.faults} signal fault(s) at "
                f"least {fitted.schedule.min_wait_s:.1f} s apart, none in the restart phase "
                "(its --max-restarts allows denser faults; a --replay against it with other "
                "limits draws another schedule)"
            )
        config = fitted
    full = config.plan or draw_schedule(config.run.seed, config.schedule)
    # The requests never change with the faults kept: poison texts are sent either way.
    run = replace(
        config.run,
        workload=replace(config.run.workload, poison_markers=tuple(full.poison_markers())),
    )
    config = replace(config, run=run)
    schedule = schedule_of(config)
    if server is not None:  # (a replayed --plan may still not fit)
        check_restart_limit(schedule, server)
    if judge is None:
        dtype = str(run.engine.get("dtype", "float32"))
        load_format = str(run.engine.get("load_format", "auto"))
        path, exact = model_path(run), None
        if server is not None:
            dtype, load_format, path = server.dtype, server.load_format, server.model_path
            if server.device != "cpu":  # the GPU's kernels round otherwise than the CPU replay
                say(
                    f"the server runs on {server.device} in {dtype}: outputs are checked for splices"
                )
                exact = False
        judge = Judge(Replayer(path, dtype, load_format=load_format), exact)
    Path(run.log_dir).mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    say(f"run: seed {run.seed}, {len(schedule.faults)} faults, {run.mode}")
    path = unused(Path(run.log_dir) / f"ledger-{run.seed}.jsonl")
    ledger, verdict = await judged_run(run, schedule, judge, path)
    outcome = Outcome(
        config, schedule, ledger, path, verdict, figures.per_fault(ledger),
        time.monotonic() - start,
    )  # fmt: skip
    say(f"run done in {outcome.seconds:.0f} s: {len(verdict.findings)} finding(s)")
    if verdict.failed and config.shrink_budget > 0:
        outcome.shrunk, outcome.shrunk_verdict = await shrink(
            run, schedule, verdict, judge, config.shrink_budget, say, ledger
        )
    outcome.seconds = time.monotonic() - start
    return outcome


def unused(path: Path) -> str:
    """``path``, or the first of ``name-2``, ``name-3``, … that is no file yet: a
    replay in the same log directory kept the failing run's ledger (it wrote over it)."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return str(candidate)


async def judged_run(
    run: RunConfig, schedule: Schedule, judge: Judge, path: str | None
) -> tuple[Ledger, Verdict]:
    ledger = Ledger(path)
    try:
        await run_once(run, schedule, ledger)
    finally:
        ledger.close()
    return ledger, judge.judge(ledger, schedule)


SEVERITY = ("engine", "terminal", "splice", "reference", "mix-up", "stream", "outcome", "leak")


def most_severe(verdict: Verdict) -> str:
    """The checker a shrink keeps failing: the engine stopping before a request
    hanging, before a wrong output, before a wrong refusal, before a leak."""
    found = verdict.checkers()
    return next((c for c in SEVERITY if c in found), min(found))


REPLAY_MARGIN = (30.0, 0.25)  # a replay runs to the finding + max(30 s, 25 % of its time)


def first_finding_at(ledger: Ledger, verdict: Verdict, wanted: set[str]) -> float | None:
    """When the first finding of a ``wanted`` checker showed (the end of its
    request); None when one of them has no time (a request that never ended, a
    finding about the whole run)."""
    records = ledger.requests()
    times = []
    for finding in verdict.findings:
        if finding.checker not in wanted:
            continue
        rec = records.get(finding.req) if finding.req is not None else None
        if rec is None or rec.end is None:
            return None
        times.append(float(rec.end["t"]))
    return min(times, default=None)


def replay_duration(duration: float | None, found_at: float | None) -> float | None:
    """How long a replay of a timed run needs to run: to the finding and a margin."""
    if duration is None or found_at is None:
        return duration
    return min(duration, found_at + max(REPLAY_MARGIN[0], REPLAY_MARGIN[1] * found_at))


def causal_faults(ledger: Ledger, schedule: Schedule, before: float | None) -> list[Fault]:
    """The faults that fired, no later than ``before`` when it is given."""
    fired: dict[int, float] = {}
    for e in ledger.of_kind("fault"):
        fired.setdefault(int(e["id"]), float(e["t"]))
    return [
        f for f in schedule.faults if f.id in fired and (before is None or fired[f.id] <= before)
    ]


async def shrink(
    run: RunConfig,
    schedule: Schedule,
    verdict: Verdict,
    judge: Judge,
    budget: int,
    say: Callable[[str], None],
    ledger: Ledger | None = None,
) -> tuple[Shrunk[Fault], Verdict | None]:
    wanted = {most_severe(verdict)}
    say(f"shrinking {len(schedule.faults)} faults for the [{min(wanted)}] failure")
    verdicts: dict[tuple[int, ...], Verdict] = {}
    found_at = first_finding_at(ledger, verdict, wanted) if ledger is not None else None
    duration = replay_duration(run.duration, found_at)
    if duration != run.duration:
        run = replace(run, duration=duration)
        say(f"shrink: replays run {duration:.0f} s (the finding came at {found_at:.0f} s)")

    async def fails(faults: list[Fault]) -> bool:
        subset = schedule.subset([f.id for f in faults])
        ids = tuple(f.id for f in faults)
        path = unused(Path(run.log_dir) / f"ledger-{run.seed}-shrink-{len(verdicts) + 1}.jsonl")
        _, got = await judged_run(run, subset, judge, path)
        verdicts[ids] = got
        failed = bool(got.checkers() & wanted)
        say(f"shrink: {len(faults)} fault(s) {list(ids)}: {'fails' if failed else 'passes'}")
        return failed

    start = list(schedule.faults)
    cut = causal_faults(ledger, schedule, found_at) if ledger is not None else start
    cut_tried: tuple[int, bool] | None = None
    # (none before it: ddmin's first replay is the empty set, which it was twice)
    if cut and len(cut) < len(start) and budget > 1:
        say(f"shrink: {len(cut)} of {len(start)} faults fired before the finding")
        budget -= 1
        cut_tried = (len(cut), await fails(cut))
        if cut_tried[1]:
            start = cut
    shrunk = await ddmin(start, fails, budget)
    if cut_tried is not None:  # one replay more than ddmin's own
        shrunk.tries += 1
        shrunk.log.insert(0, cut_tried)
    key = tuple(f.id for f in shrunk.items)
    return shrunk, verdicts.get(key, verdict if len(shrunk.items) == len(schedule.faults) else None)

"""A campaign: draw the schedule, run it, judge it, and shrink it if it failed.

The same seed draws the same schedule and the same requests, so a run is
replayed by its seed (``--replay SEED``), and a subset of its faults by
their ids (``--faults 3,7``). Shrinking replays subsets of the failing
schedule (:mod:`rt.chaos.shrink`); a subset fails when its run gets a
finding from one of the checkers the original run failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rt.chaos import figures
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


async def campaign(
    config: CampaignConfig, say: Callable[[str], None] = lambda _: None, judge: Judge | None = None
) -> Outcome:
    full = config.plan or draw_schedule(config.run.seed, config.schedule)
    # The requests never change with the faults kept: poison texts are sent either way.
    run = replace(
        config.run,
        workload=replace(config.run.workload, poison_markers=tuple(full.poison_markers())),
    )
    config = replace(config, run=run)
    schedule = schedule_of(config)
    if judge is None:
        dtype = str(run.engine.get("dtype", "float32"))
        load_format = str(run.engine.get("load_format", "auto"))
        replayer = Replayer(model_path(run), dtype, load_format=load_format)
        judge = Judge(replayer, solo=run.concurrency == 1)
    Path(run.log_dir).mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    say(f"run: seed {run.seed}, {len(schedule.faults)} faults, {run.mode}")
    path = str(Path(run.log_dir) / f"ledger-{run.seed}.jsonl")
    ledger, verdict = await judged_run(run, schedule, judge, path)
    outcome = Outcome(
        config, schedule, ledger, path, verdict, figures.per_fault(ledger),
        time.monotonic() - start,
    )  # fmt: skip
    say(f"run done in {outcome.seconds:.0f} s: {len(verdict.findings)} finding(s)")
    if verdict.failed and config.shrink_budget > 0:
        outcome.shrunk, outcome.shrunk_verdict = await shrink(
            run, schedule, verdict, judge, config.shrink_budget, say
        )
    outcome.seconds = time.monotonic() - start
    return outcome


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


async def shrink(
    run: RunConfig,
    schedule: Schedule,
    verdict: Verdict,
    judge: Judge,
    budget: int,
    say: Callable[[str], None],
) -> tuple[Shrunk[Fault], Verdict | None]:
    wanted = {most_severe(verdict)}
    say(f"shrinking {len(schedule.faults)} faults for the [{min(wanted)}] failure")
    verdicts: dict[tuple[int, ...], Verdict] = {}

    async def fails(faults: list[Fault]) -> bool:
        subset = schedule.subset([f.id for f in faults])
        ids = tuple(f.id for f in faults)
        path = str(Path(run.log_dir) / f"ledger-{run.seed}-shrink-{len(verdicts) + 1}.jsonl")
        _, got = await judged_run(run, subset, judge, path)
        verdicts[ids] = got
        failed = bool(got.checkers() & wanted)
        say(f"shrink: {len(faults)} fault(s) {list(ids)}: {'fails' if failed else 'passes'}")
        return failed

    shrunk = await ddmin(list(schedule.faults), fails, budget)
    key = tuple(f.id for f in shrunk.items)
    return shrunk, verdicts.get(key, verdict if len(shrunk.items) == len(schedule.faults) else None)

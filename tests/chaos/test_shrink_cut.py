"""What a shrink may leave out before it replays anything: faults that never
fired or fired only after the first finding it keeps (causality), and the
part of a timed run after that finding."""

from __future__ import annotations

from typing import Any

from rt.chaos.campaign import causal_faults, first_finding_at, replay_duration
from rt.chaos.checks import Finding
from rt.chaos.ledger import Ledger
from rt.chaos.schedule import Schedule
from rt.chaos.verdict import Verdict


def schedule(n: int) -> Schedule:
    fault = {"kind": "sigkill", "actor": "scheduler", "via": "plan", "phase": "frame",
             "point": "receive"}  # fmt: skip
    return Schedule.from_json({"seed": 1, "faults": [fault | {"id": i} for i in range(n)]})


def events() -> list[dict[str, Any]]:
    spec = {"index": 0, "prompt": "p"}
    return [
        {"ev": "invoke", "t": 1.0, "req": 0, "spec": spec},
        {"ev": "end", "t": 9.0, "req": 0, "state": "failed-final", "ids": [], "text": ""},
        {"ev": "invoke", "t": 2.0, "req": 1, "spec": spec | {"index": 1}},
        {"ev": "end", "t": 20.0, "req": 1, "state": "failed-final", "ids": [], "text": ""},
        {"ev": "fault", "t": 3.0, "id": 0},
        {"ev": "fault", "t": 8.5, "id": 2},
        {"ev": "fault", "t": 8.7, "id": 2},  # a second firing: the first one counts
        {"ev": "fault", "t": 12.0, "id": 3},
    ]  # fault 1 never fired, fault 3 only after the first finding


def test_the_first_finding_of_the_kept_checker_is_the_end_of_its_request() -> None:
    ledger = Ledger.of(events())
    verdict = Verdict(findings=[Finding("outcome", "x", 1), Finding("outcome", "y", 0),
                                Finding("leak", "z")])  # fmt: skip
    assert first_finding_at(ledger, verdict, {"outcome"}) == 9.0
    assert first_finding_at(ledger, verdict, {"leak"}) is None  # no time: no cut
    assert first_finding_at(ledger, verdict, {"engine"}) is None


def test_only_faults_that_fired_before_the_finding_can_have_caused_it() -> None:
    ledger, plan = Ledger.of(events()), schedule(5)
    assert [f.id for f in causal_faults(ledger, plan, 9.0)] == [0, 2]
    assert [f.id for f in causal_faults(ledger, plan, None)] == [0, 2, 3]  # those that fired
    assert causal_faults(ledger, plan, 1.0) == []


def test_a_timed_run_is_replayed_only_past_its_finding() -> None:
    assert replay_duration(600.0, 400.0) == 500.0  # + 25 %
    assert replay_duration(600.0, 20.0) == 50.0  # + at least 30 s
    assert replay_duration(600.0, 590.0) == 600.0  # never longer than the run
    assert replay_duration(600.0, None) == 600.0 and replay_duration(None, 5.0) is None


async def test_a_finding_before_any_fault_is_replayed_once_with_none(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """No fault fired before the finding: the cut is the empty set, which ddmin
    replays first too; it was replayed twice (a whole run each)."""
    import importlib

    from rt.chaos.run import RunConfig

    campaign = importlib.import_module("rt.chaos.campaign")  # (rt.chaos.campaign: a function)

    replays: list[list[int]] = []

    async def judged_run(run, subset, judge, path):  # type: ignore[no-untyped-def]
        # (the engine's runs stand aside: this is the shrink's bookkeeping of them)
        replays.append([f.id for f in subset.faults])
        return Ledger.of([]), Verdict(findings=[Finding("outcome", "x", 0)])

    monkeypatch.setattr(campaign, "judged_run", judged_run)
    ledger = Ledger.of(events())
    verdict = Verdict(findings=[Finding("outcome", "x", 0)])  # at 9.0; faults at 3.0, 8.5
    early = Ledger.of([e | {"t": e["t"] + 10} if e["ev"] == "fault" else e for e in events()])
    run = RunConfig(seed=1, log_dir=str(tmp_path))
    shrunk, _ = await campaign.shrink(run, schedule(5), verdict, None, 8, lambda _: None, early)
    assert replays == [[]] and shrunk.items == [] and shrunk.tries == 1
    shrunk, _ = await campaign.shrink(run, schedule(5), verdict, None, 8, lambda _: None, ledger)
    assert replays[1] == [0, 2]  # (faults that fired before it: the cut, then ddmin's)

"""The report: one screen, and the same as JSON."""

from __future__ import annotations

import json
from typing import Any

from rt.chaos import figures
from rt.chaos.campaign import CampaignConfig, Outcome
from rt.chaos.checks import Finding
from rt.chaos.ledger import Ledger
from rt.chaos.report import render, summary
from rt.chaos.run import RunConfig
from rt.chaos.schedule import Fault, Schedule, ScheduleConfig
from rt.chaos.shrink import Shrunk
from rt.chaos.verdict import Verdict

EVENTS: list[dict[str, Any]] = [
    {"ev": "actor", "t": 0.0, "name": "scheduler", "state": "running", "incarnation": 1, "restarts": 0},
    {"ev": "fault", "t": 1.0, "id": 0, "kind": "sigkill", "actor": "scheduler", "via": "signal",
     "observed": "stream", "crash": True},
    {"ev": "actor", "t": 1.1, "name": "scheduler", "state": "restarting", "incarnation": 1,
     "restarts": 1, "exit_at": 1.01},
    {"ev": "actor", "t": 3.0, "name": "scheduler", "state": "running", "incarnation": 2, "restarts": 1},
    {"ev": "invoke", "t": 0.5, "req": 0, "spec": {"hostile": None}},
    {"ev": "end", "t": 4.0, "req": 0, "state": "completed", "ids": [1], "text": "a"},
]  # fmt: skip


def outcome(findings: list[Finding]) -> Outcome:
    fault = Fault(0, "sigkill", "scheduler", "signal", "stream")
    ledger = Ledger.of(EVENTS)
    out = Outcome(
        CampaignConfig(RunConfig(seed=9), ScheduleConfig()),
        Schedule(9, (fault,)),
        ledger,
        "ledger-9.jsonl",
        Verdict(findings, checked=1),
        figures.per_fault(ledger),
        12.0,
    )
    if findings:
        out.shrunk = Shrunk([fault], tries=3)
    return out


def test_a_passing_report() -> None:
    text = render(outcome([]))
    assert text.splitlines()[0].startswith("rt-chaos  seed 9  engine  float32")
    assert "kind sigkill" in text and "actor scheduler" in text
    assert text.endswith("PASS")
    data = summary(outcome([]))
    assert (
        data["passed"]
        and data["requests"]["completed"] == 1
        and data["restarts"] == {"scheduler": 1}
    )
    assert data["figures"]["kind"]["sigkill"]["detect_s"]["max"] > 0
    assert data["figures"]["actor"]["scheduler"]["failed"] == 0  # the request completed
    assert "failed while a fault was in play" not in text
    json.dumps(data)


def test_restarts_are_the_runs_own_on_a_server_whose_actors_restarted_before() -> None:
    """An attached server's counts are since its start: a second run reported the
    first run's restarts as its own."""
    earlier = outcome([])
    earlier.ledger = Ledger.of([{**e, "restarts": e["restarts"] + 4} if e["ev"] == "actor" else e
                                for e in EVENTS])  # fmt: skip
    assert summary(earlier)["restarts"] == {"scheduler": 1}


def test_requests_failed_under_a_fault_are_blamed_on_its_kind_and_actor() -> None:
    failed = outcome([])
    failed.ledger = Ledger.of(
        [*EVENTS[:-1], {"ev": "end", "t": 4.0, "req": 0, "state": "failed-final", "error": "x"}]
    )
    failed.faults = figures.per_fault(failed.ledger)
    data = summary(failed)
    assert data["figures"]["kind"]["sigkill"]["failed"] == 1
    assert data["figures"]["actor"]["scheduler"]["failed_reasons"] == {"failed-final: x": 1}
    assert "  kind sigkill: 1 × failed-final: x" in render(failed)


def test_a_failing_report_names_the_findings_and_the_shortest_schedule() -> None:
    text = render(outcome([Finding("terminal", "hung", 0)]))
    assert "[terminal] request 0: hung" in text
    assert "shortest schedule that still fails [terminal]: 1 of 1 fault(s), 3 replays" in text
    assert "rt-chaos --replay 9 --faults 0" in text
    assert text.endswith("FAIL")


def test_a_run_in_which_no_planned_fault_fired_is_inconclusive() -> None:
    """An attached run of 10 faults fired none (its first waited for a restart no
    fault could cause) and said PASS, exit 0: it tested nothing."""
    quiet = outcome([])
    quiet.ledger = Ledger.of([e for e in EVENTS if e["ev"] != "fault"])
    text = render(quiet)
    assert text.splitlines()[-1].startswith("INCONCLUSIVE: no fault fired")
    assert summary(quiet)["inconclusive"] and not summary(outcome([]))["inconclusive"]
    quiet.verdict = Verdict([Finding("outcomes", "lost", 0)], checked=1)
    assert render(quiet).endswith("FAIL")  # (a failure without faults stays one)


def test_a_harness_finding_shows_on_the_checks_line_and_delays_are_said_unseen() -> None:
    """The checks line had no harness column (a run it failed passed every column
    shown), and a delay counted as planned, never as fired, unexplained."""
    failed = outcome([Finding("harness", "a request raised in the harness")])
    failed.schedule = Schedule(
        9,
        (
            *failed.schedule.faults,
            Fault(1, "delay", "detokenizer", "plan", "frame", point="receive"),
        ),
    )
    text = render(failed)
    checks = next(line for line in text.splitlines() if line.startswith("checks"))
    assert "harness FAIL" in checks, checks
    assert "planned 2, fired 1 times, 0 never (1 delays, which leave no line)" in text, text
    assert summary(failed)["checks"]["harness"] == "FAIL"


def test_the_replay_command_is_the_runs_own_with_its_seed_and_shortest_faults() -> None:
    """It said "rt-chaos --replay 9 --faults 0 (with the same options)": no command
    to run; for a --schedule run a wrong one (a seed draws another schedule)."""
    from dataclasses import replace

    failed = outcome([Finding("terminal", "hung", 0)])
    argv = ("--in-process", "--seed", "9", "--requests", "12", "--faults=0,3", "--kinds", "raise")
    failed.config = replace(failed.config, argv=argv)
    assert summary(failed)["shrunk"]["replay"] == (
        "rt-chaos --in-process --requests 12 --kinds raise --replay 9 --faults 0"
    )
    failed.config = replace(
        failed.config, argv=("--schedule", "my plan.json", "--faults", "0,3"), plan=failed.schedule
    )
    assert summary(failed)["shrunk"]["replay"] == "rt-chaos --schedule 'my plan.json' --faults 0"


def test_a_ledger_already_in_the_log_directory_is_kept(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from rt.chaos.campaign import unused

    first = tmp_path / "ledger-9.jsonl"
    assert unused(first) == str(first)
    first.write_text("the failing run's\n")
    assert unused(first) == str(tmp_path / "ledger-9-2.jsonl")
    (tmp_path / "ledger-9-2.jsonl").write_text("")
    assert unused(first) == str(tmp_path / "ledger-9-3.jsonl")

"""Figures from a hand-made ledger: detection, restore, back, health gap, percentiles."""

from __future__ import annotations

import pytest

from rt.chaos import figures
from rt.chaos.ledger import Ledger

EVENTS = [
    {"ev": "actor", "t": 0.0, "name": "scheduler", "state": "running", "incarnation": 1},
    {"ev": "health", "t": 0.0, "ok": True},
    {"ev": "fault", "t": 10.0, "kind": "sigkill", "actor": "scheduler", "crash": True},
    {
        "ev": "actor",
        "t": 10.2,
        "name": "scheduler",
        "state": "restarting",
        "incarnation": 1,
        "exit_at": 10.05,
    },
    {"ev": "health", "t": 10.3, "ok": False},
    {"ev": "actor", "t": 12.0, "name": "scheduler", "state": "running", "incarnation": 2},
    {"ev": "health", "t": 12.0, "ok": True},
    {"ev": "invoke", "t": 9.0, "req": 0, "spec": {}},
    {"ev": "delta", "t": 12.5, "req": 0, "index": 0, "text": "a", "ids": [1]},
    {"ev": "invoke", "t": 11.0, "req": 1, "spec": {}},
    {"ev": "delta", "t": 13.0, "req": 1, "index": 0, "text": "a", "ids": [1]},
    {"ev": "fault", "t": 20.0, "kind": "delay", "actor": "scheduler", "crash": False},
]


def test_per_fault_figures() -> None:
    crash, delay = figures.per_fault(Ledger.of(EVENTS))
    assert crash.detect_s == pytest.approx(0.05)  # the supervisor's own exit time
    assert crash.back_s == pytest.approx(2.0)
    assert crash.restore_s == pytest.approx(3.0)  # request 1: sent after the fault
    assert crash.health_gap_s == pytest.approx(0.3)
    assert delay.detect_s is None and delay.restore_s is None


def test_summaries_by_kind_and_actor() -> None:
    by = figures.summarize(figures.per_fault(Ledger.of(EVENTS)))
    assert set(by["kind"]) == {"sigkill", "delay"} and by["actor"]["scheduler"].n == 2
    stats = by["kind"]["sigkill"].stats("detect_s")
    assert stats is not None and stats["n"] == 1
    assert by["kind"]["delay"].stats("detect_s") is None


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert figures.percentile(values, 50) == 50
    assert figures.percentile(values, 99) == 99
    assert figures.percentile([3.0], 99) == 3.0


def test_failures_are_counted_by_reason() -> None:
    events = [
        {"ev": "invoke", "t": 0, "req": 0, "spec": {}},
        {"ev": "end", "t": 1, "req": 0, "state": "failed-final", "error": "RequestFailedError: x"},
        {"ev": "invoke", "t": 0, "req": 1, "spec": {"hostile": "poison"}},
        {"ev": "end", "t": 1, "req": 1, "state": "failed-final", "error": "RequestFailedError: x"},
        {"ev": "invoke", "t": 0, "req": 2, "spec": {}},
        {"ev": "end", "t": 1, "req": 2, "state": "cancelled"},
    ]
    assert figures.failures(Ledger.of(events)) == {
        "failed-final: RequestFailedError: x": 1,
        "failed-final [poison]: RequestFailedError: x": 1,
    }


def test_requests_a_fault_failed_are_counted_per_kind_and_actor() -> None:
    events = [
        {"ev": "invoke", "t": 0.0, "req": 0, "spec": {}},  # in flight at the kill: failed
        {"ev": "fault", "t": 1.0, "kind": "sigkill", "actor": "detokenizer", "crash": True},
        {"ev": "end", "t": 2.0, "req": 0, "state": "failed-retryable", "error": "Broken: gone"},
        {"ev": "invoke", "t": 0.0, "req": 1, "spec": {"hostile": "fuzz"}},  # its own fault
        {"ev": "end", "t": 2.0, "req": 1, "state": "failed-final", "error": "bad"},
        {"ev": "invoke", "t": 3.0, "req": 2, "spec": {}},  # sent after the kill's end
        {"ev": "fault", "t": 3.5, "kind": "raise", "actor": "scheduler", "crash": True},
        {"ev": "end", "t": 4.0, "req": 2, "state": "completed"},
        {"ev": "invoke", "t": 0.5, "req": 3, "spec": {}},  # ended before the raise
        {"ev": "end", "t": 1.5, "req": 3, "state": "cancelled"},
    ]
    kill, raised = figures.per_fault(Ledger.of(events))
    assert kill.failed == ["failed-retryable: Broken: gone"] and raised.failed == []
    by = figures.summarize([kill, raised])
    assert by["kind"]["sigkill"].failed == {"failed-retryable: Broken: gone": 1}
    assert by["actor"]["detokenizer"].failed == {"failed-retryable: Broken: gone": 1}
    assert not by["actor"]["scheduler"].failed


def test_a_stop_is_detected_by_its_restart_not_by_its_suspension() -> None:
    """An attached server's /server_info says "suspended" from a SIGSTOP on: the
    stop's detection is still the watchdog's restart (it read 0.05 s)."""
    events = [
        {"ev": "actor", "t": 0.0, "name": "detokenizer", "state": "running", "incarnation": 1},
        {"ev": "fault", "t": 10.0, "kind": "sigstop", "actor": "detokenizer", "crash": True},
        {"ev": "actor", "t": 10.05, "name": "detokenizer", "state": "suspended",
         "incarnation": 1},
        {"ev": "actor", "t": 42.5, "name": "detokenizer", "state": "restarting",
         "incarnation": 1, "exit_at": 42.4},
        {"ev": "actor", "t": 43.0, "name": "detokenizer", "state": "running", "incarnation": 2},
    ]  # fmt: skip
    (stop,) = figures.per_fault(Ledger.of(events))
    assert stop.detect_s == pytest.approx(32.4) and stop.back_s == pytest.approx(33.0)

"""The checkers over hand-made ledgers: each catches what it is for, and passes a clean run."""

from __future__ import annotations

from typing import Any

from rt.chaos import checks
from rt.chaos.ledger import Ledger


def spec(i: int, **over: Any) -> dict[str, Any]:
    base = {"index": i, "prompt": f"p{i}", "max_new_tokens": 3, "temperature": 0.0,
            "top_p": 1.0, "seed": None, "cancel_after": None, "hostile": None, "marker": None}  # fmt: skip
    return base | over


def request(
    i: int, ids: list[int], state: str = "completed", t: float = 1.0, **end: Any
) -> list[dict[str, Any]]:
    text = "".join(f"<{x}>" for x in ids)
    return [
        {"ev": "invoke", "t": t, "req": i, "spec": spec(i, **end.pop("spec", {}))},
        *(
            {
                "ev": "delta",
                "t": t + 0.1 * (k + 1),
                "req": i,
                "index": 0,
                "text": f"<{x}>",
                "ids": [x],
            }
            for k, x in enumerate(ids)
        ),
        {"ev": "end", "t": t + 1, "req": i, "state": state, "ids": ids, "text": text, **end},
    ]


def decode(ids: Any) -> str:
    return "".join(f"<{x}>" for x in ids)


def test_a_clean_ledger_passes_every_checker() -> None:
    ledger = Ledger.of(request(0, [1, 2, 3]) + request(1, [4, 5, 6]))
    ref = {0: [1, 2, 3], 1: [4, 5, 6]}
    assert checks.terminal(ledger) == []
    assert checks.outcomes(ledger, set()) == []
    assert checks.streams(ledger, decode) == []
    assert checks.against_reference(ledger, ref) == []
    assert checks.engine(ledger) == []


def test_lost_hung_and_twice_ended_requests_are_found() -> None:
    events = request(0, [1, 2, 3])[:1] + request(1, [1], state="hung", error="no terminal state")
    events += request(2, [1, 2, 3]) + request(2, [1, 2, 3])[-1:]
    found = checks.terminal(Ledger.of(events))
    assert [(f.req, f.message.split(":")[0]) for f in found] == [
        (0, "lost"),
        (1, "hung"),
        (2, "ended 2 times"),
    ]


FUZZ = {"hostile": "fuzz"}


def test_outcomes_innocents_complete_hostiles_are_refused() -> None:
    events = (
        request(0, [], state="failed-final", error="RequestFailedError: boom")
        + request(
            1, [], state="failed-final", error="InvalidRequestError: x", spec={"hostile": "invalid"}
        )
        + request(2, [7], state="completed", spec={"hostile": "invalid"})
        + request(3, [], state="failed-final", status=500, spec={"hostile": "fuzz"})
        + request(
            4,
            [],
            state="failed-final",
            error="RequestFailedError",
            spec={"hostile": "poison", "marker": "P"},
        )
        + request(5, [1], state="cancelled", spec={"cancel_after": 1})
        + request(6, [1], state="cancelled")
        + request(7, [], state="failed-retryable", error="EngineShutdownError", at_shutdown=True)
        + request(8, [], state="failed-retryable", error="ServiceUnavailableError")
        # over the context (a long prompt, a long --max-tokens): a right refusal, unless a 5xx
        + request(9, [], state="failed-final", error="ContextOverflowError: too long")
        + request(10, [], state="failed-final", status=400, error="ContextOverflowError: x")
        + request(11, [], state="failed-final", status=500, error="ContextOverflowError: x")
        # a fuzzed body rt.client refuses before sending (2**63 in a field): refused, no status
        + request(12, [], state="failed-final", error="InvalidRequestError: x", spec=FUZZ)
        + request(13, [], state="failed-final", error="RequestFailedError: x", spec=FUZZ)
    )
    found = {f.req for f in checks.outcomes(Ledger.of(events), {"P"})}
    assert found == {0, 2, 3, 6, 8, 11, 13}


def test_streams_catch_duplicated_missing_and_undecodable_text() -> None:
    dup = request(0, [1, 2, 3])
    dup.insert(2, {"ev": "delta", "t": 1.15, "req": 0, "index": 0, "text": "<1>", "ids": [1]})
    short = request(1, [1, 2])  # 2 tokens where 3 were asked for, ignore_eos
    wrong_text = request(2, [1, 2, 3])
    wrong_text[-1]["text"] = "<1><2><2>"
    anomaly = [
        {
            "ev": "anomaly",
            "t": 2.0,
            "req": 3,
            "what": "an SSE event does not extend the one before it",
        }
    ]
    found = checks.streams(Ledger.of(dup + short + wrong_text + anomaly), decode)
    assert {f.req for f in found} == {0, 1, 2, 3}


def test_a_diverged_output_is_found_and_a_mixup_is_named() -> None:
    ref = {0: [1, 2, 3], 1: [4, 5, 6, 7, 8], 2: [9, 9, 9]}
    events = request(0, [1, 2, 4]) + request(2, [4, 5, 6, 7], spec={"max_new_tokens": 4})
    events += request(1, [4, 5], state="cancelled", spec={"cancel_after": 2})
    found = checks.against_reference(Ledger.of(events), ref)
    assert [(f.checker, f.req) for f in found] == [("reference", 0), ("mix-up", 2)]
    assert "request 1" in found[1].message


def test_no_splicing_names_the_first_token_over_the_tolerance() -> None:
    events = request(0, [1, 2, 3]) + request(1, [4, 5, 6, 7], resumed_from=[1])
    events += request(2, [9, 9], state="cancelled", spec={"cancel_after": 2})
    margins = {0: [0.0, 0.01, 0.2], 1: [0.0, 0.0, 3.0, 0.7], 2: [0.0, 9.0]}
    found = checks.no_splicing(Ledger.of(events), lambda rec, ids: margins[rec.index])
    assert [(f.checker, f.req) for f in found] == [("splice", 1), ("splice", 2)]
    assert "token 2 of 4" in found[0].message and "2 such token(s)" in found[0].message
    assert "resumed from [1]" in found[0].message
    within = {0: [0.0] * 3, 1: [checks.SPLICE_TOLERANCE] * 4, 2: [0.0, 0.0]}
    assert checks.no_splicing(Ledger.of(events), lambda rec, ids: within[rec.index]) == []


def test_engine_findings_escalation_exit_leaks_and_unclean_stops() -> None:
    events = [
        {"ev": "escalated", "t": 1, "error": "EscalationError: too many"},
        {"ev": "server", "t": 2, "code": 3, "tail": "gave up"},
        {"ev": "server", "t": 2, "code": 0},
        {"ev": "leak", "t": 3, "what": "segments left"},
        {
            "ev": "stopped",
            "t": 3,
            "name": "scheduler",
            "reason": "stopped (SIGKILL after 5 s grace)",
        },
        {"ev": "stopped", "t": 3, "name": "detokenizer", "reason": "stopped (exit code 0)"},
    ]
    assert [f.checker for f in checks.engine(Ledger.of(events))] == [
        "engine",
        "engine",
        "leak",
        "leak",
    ]


def test_an_innocent_refused_after_enough_planned_crashes_is_no_finding() -> None:
    error = (
        "RequestFailedError: request r was in flight for 3 scheduler crashes, the last with "
        "no other suspect beside it"
    )
    events = request(0, [], state="failed-final", error=error)  # in flight from 1.0 to 2.0
    crash = {"ev": "fault", "kind": "sigkill", "actor": "scheduler", "crash": True}
    two = [crash | {"t": 1.2}, crash | {"t": 1.5}]
    assert [f.checker for f in checks.outcomes(Ledger.of(events + two), set())] == ["outcome"]
    three = [*two, crash | {"t": 1.8}]
    assert checks.outcomes(Ledger.of(events + three), set()) == []
    elsewhere = [*two, crash | {"t": 1.8, "actor": "detokenizer"}]
    assert len(checks.outcomes(Ledger.of(events + elsewhere), set())) == 1
    # fired just before the request was sent, seen by rt after: it counts; long before: not
    just_before = [*two, crash | {"t": 0.9}]
    assert checks.outcomes(Ledger.of(events + just_before), set()) == []
    long_before = [*two, crash | {"t": -0.5}]
    assert len(checks.outcomes(Ledger.of(events + long_before), set())) == 1


def test_an_innocent_refused_for_a_poison_request_s_crashes_is_a_finding() -> None:
    """A poison request crashes the scheduler only while it is in the core, so an
    innocent refused after crashes that were all the poison's was blamed for it
    (the defect review found: co-batched innocents failed with the culprit)."""
    error = "RequestFailedError: request r was in flight for 3 scheduler crashes in a row"
    events = request(0, [], state="failed-final", error=error)  # in flight from 1.0 to 2.0
    crash = {"ev": "fault", "kind": "raise", "actor": "scheduler", "crash": True, "id": 7}
    poisoned = [crash | {"t": 1.2}, crash | {"t": 1.5}, crash | {"t": 1.8}]
    found = checks.outcomes(Ledger.of(events + poisoned), set(), frozenset({7}))
    assert [(f.checker, f.req) for f in found] == [("outcome", 0)]
    one_planned = [*poisoned[:2], crash | {"t": 1.8, "id": 2}]
    assert checks.outcomes(Ledger.of(events + one_planned), set(), frozenset({7})) == []

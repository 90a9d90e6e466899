"""The judge: which outputs meet which reference, in float32 and in bfloat16
(a stub engine core: references and next-token choices given by hand)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rt.chaos.ledger import Ledger
from rt.chaos.reference import Job
from rt.chaos.schedule import Schedule
from rt.chaos.verdict import Judge


class StubCore:
    """Prompts are their own ids; the uninterrupted run is ``runs[()]``; a run
    conditioned on a prefix draws what one of the ``runs`` (keyed by where they
    resumed) has next after it, each of the other runs' tokens trailing the
    uninterrupted run's choice by ``trail`` logits."""

    def __init__(
        self, dtype: str, runs: dict[tuple[int, ...], list[int]], trail: float = 0.0
    ) -> None:
        self.dtype, self.runs, self.trail = dtype, runs, trail

    def encode(self, text: str) -> list[int]:
        return [len(text)]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(f"<{i}>" for i in ids)

    def reference(self, jobs: Sequence[Job]) -> dict[str, list[int]]:
        return {job.key: self.runs[()][: job.options["max_new_tokens"]] for job in jobs}

    def margins(self, job: Job, ids: Sequence[int]) -> list[float]:
        def margin(j: int) -> float:
            if self.runs[()][: j + 1] == list(ids[: j + 1]):
                return 0.0
            whole = [[*k, *run] for k, run in self.runs.items()]
            return self.trail if any(w[: j + 1] == list(ids[: j + 1]) for w in whole) else 5.0

        return [margin(j) for j in range(len(ids))]


def ledger(*outputs: tuple[list[int], list[int] | None]) -> Ledger:
    events: list[dict[str, Any]] = [
        {"ev": "actor", "t": 0.0, "name": "scheduler", "state": "running", "incarnation": 1, "restarts": 0},
        {"ev": "fault", "t": 4.0, "kind": "sigkill", "actor": "scheduler", "crash": True},
        {"ev": "actor", "t": 5.0, "name": "scheduler", "state": "running", "incarnation": 2, "restarts": 1},
    ]  # fmt: skip
    for i, (ids, resumed) in enumerate(outputs):
        spec = {"index": i, "prompt": "p", "max_new_tokens": len(ids), "temperature": 0.0,
                "top_p": 1.0, "seed": None, "hostile": None}  # fmt: skip
        end = {"ev": "end", "t": 9.0, "req": i, "state": "completed", "ids": ids,
               "text": "".join(f"<{x}>" for x in ids)}  # fmt: skip
        if resumed is not None:
            end["resumed_from"] = resumed
        events += [{"ev": "invoke", "t": 1.0, "req": i, "spec": spec}, end]
    return Ledger.of(events)


RUNS = {(): [1, 2, 3, 4], (1, 2): [7, 8]}


def test_float32_outputs_must_equal_the_uninterrupted_run() -> None:
    judge = Judge(StubCore("float32", RUNS, trail=0.2))  # type: ignore[arg-type]
    verdict = judge.judge(ledger(([1, 2, 3, 4], None), ([1, 2, 7, 8], [2])), Schedule(1))
    assert [(f.checker, f.req) for f in verdict.findings] == [("reference", 1)]
    assert verdict.checked == 2


def test_a_float32_output_that_took_the_other_side_of_an_exact_tie_is_its_own_run() -> None:
    """Where the best two logits are ~1 ulp apart, what else is in the batch picks
    between them; every token after is that run's own draw."""
    judge = Judge(StubCore("float32", RUNS, trail=1e-6))  # type: ignore[arg-type]
    verdict = judge.judge(ledger(([1, 2, 3, 4], None), ([1, 2, 7, 8], None)), Schedule(1))
    assert verdict.findings == [] and verdict.checked == 2
    # the tie, then the uninterrupted run's next token: a splice after it, a finding
    spliced = judge.judge(ledger(([1, 2, 7, 4], None)), Schedule(1))
    assert [(f.checker, f.req) for f in spliced.findings] == [("reference", 0)]


def test_bfloat16_checks_every_output_token_by_token() -> None:
    """Resumed or not, with resume points known or not: a resumed run passes, a
    splice (the old run's 3, then the new run's 8, drawn after 7) does not."""
    judge = Judge(StubCore("bfloat16", RUNS))  # type: ignore[arg-type]
    good = ledger(([1, 2, 3, 4], None), ([1, 2, 7, 8], None), ([1, 2, 7, 8], [2]))
    verdict = judge.judge(good, Schedule(1))
    assert verdict.findings == [] and verdict.checked == 3
    spliced = judge.judge(ledger(([1, 2, 3, 4], None), ([1, 2, 3, 8], [2])), Schedule(1))
    assert [(f.checker, f.req) for f in spliced.findings] == [("splice", 1)]
    assert "token 3 of 4" in spliced.findings[0].message

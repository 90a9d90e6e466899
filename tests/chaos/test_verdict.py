"""The judge: which outputs meet which reference, in float32 and in bfloat16
(a stub engine core: references and single runs given by hand)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rt.chaos.ledger import Ledger
from rt.chaos.reference import Job
from rt.chaos.schedule import Schedule
from rt.chaos.verdict import Judge


class StubCore:
    """Prompts are their own ids; a run from a prefix continues with what ``runs`` says."""

    def __init__(self, dtype: str, runs: dict[tuple[int, ...], list[int]]) -> None:
        self.dtype, self.runs = dtype, runs

    def encode(self, text: str) -> list[int]:
        return [len(text)]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(f"<{i}>" for i in ids)

    def reference(self, jobs: Sequence[Job]) -> dict[str, list[int]]:
        return {job.key: self.runs[()][: job.options["max_new_tokens"]] for job in jobs}

    def continues(self, job: Job, prefix: Sequence[int], expected: Sequence[int]) -> bool:
        return self.runs.get(tuple(prefix), [])[: len(expected)] == list(expected)


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
    judge = Judge(StubCore("float32", RUNS), solo=False)  # type: ignore[arg-type]
    verdict = judge.judge(ledger(([1, 2, 3, 4], None), ([1, 2, 7, 8], [2])), Schedule(1))
    assert [(f.checker, f.req) for f in verdict.findings] == [("reference", 1)]
    assert verdict.checked == 2


def test_bfloat16_one_at_a_time_checks_every_output_as_single_runs() -> None:
    judge = Judge(StubCore("bfloat16", RUNS), solo=True)  # type: ignore[arg-type]
    good = ledger(([1, 2, 3, 4], None), ([1, 2, 7, 8], None), ([1, 2, 7, 8], [2]))
    verdict = judge.judge(good, Schedule(1))
    assert verdict.findings == [] and verdict.unchecked == 0
    spliced = judge.judge(ledger(([1, 2, 3, 8], None)), Schedule(1))
    assert [f.checker for f in spliced.findings] == ["splice"]


def test_bfloat16_batched_checks_only_what_has_resume_points() -> None:
    judge = Judge(StubCore("bfloat16", RUNS), solo=False)  # type: ignore[arg-type]
    verdict = judge.judge(ledger(([9, 9, 9, 9], None), ([1, 2, 7, 8], [2])), Schedule(1))
    assert verdict.findings == [] and verdict.unchecked == 1 and verdict.checked == 1

"""The request table merges idempotently, keeps one run's output (epoch and
attempt), and isolates the request that crashes the scheduler."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rt.errors import InvalidRequestError
from rt.frontend.table import OutputGap, RequestTable
from rt.gpu.sampling_params import SamplingParams
from rt.messages import GenerateRequest, Refused, SeqDelta, Tokenized


def delta(rid: str, tok_off: int, ids: list[int], txt_off: int, text: str, **kw) -> SeqDelta:
    kw.setdefault("epoch", 1)
    return SeqDelta(rid, 0, tok_off, tuple(ids), txt_off, text, **kw)


def add(table: RequestTable, rid: str, n: int = 1, tokenized: bool = True) -> None:
    req = GenerateRequest(rid, text="hi", sampling=SamplingParams(max_new_tokens=8, n=n))
    table.add(req, f"user-{rid}", epoch=1)
    if tokenized:
        assert table.on_tokenized(Tokenized(rid, np.arange(10, 20))) is not None


@pytest.fixture
def table() -> RequestTable:
    table = RequestTable(max_crashes=3)
    add(table, "a")
    assert table.on_tokenized(Tokenized("a", np.arange(5))) is None, "a duplicate is no news"
    return table


def test_redelivered_and_overlapping_deltas_are_merged_once(table) -> None:
    first = table.on_delta(delta("a", 0, [1, 2], 0, "ab"))
    assert first is not None and (first.ids, first.text) == ([1, 2], "ab")
    assert table.on_delta(delta("a", 0, [1, 2], 0, "ab")) is None  # a duplicate
    overlap = table.on_delta(delta("a", 1, [2, 3, 4], 1, "bcd", finish_reason="length"))
    assert overlap is not None and (overlap.ids, overlap.text, overlap.finished) == (
        [3, 4],
        "cd",
        True,
    )
    seq = table.records["a"].seqs[0]
    assert (seq.output_ids, seq.text, seq.finish_reason) == ([1, 2, 3, 4], "abcd", "length")
    assert table.records["a"].finished and table.live() == []
    assert table.on_delta(delta("a", 4, [5], 4, "e")) is None  # nothing after the finish


def test_a_gap_is_never_skipped_and_its_request_resumes_at_its_next_attempt(table) -> None:
    table.on_delta(delta("a", 0, [1, 2], 0, "ab"))
    with pytest.raises(OutputGap, match="gap"):  # a frame lost: tokens 2 and 3 missing
        table.on_delta(delta("a", 4, [9], 4, "x"))
    assert table.records["a"].seqs[0].output_ids == [1, 2]
    record = table.records["a"]
    table.new_attempt(record)
    assert record.seqs[0].resumed_from == [2]
    sub = table.resubmission(record)
    assert sub is not None and sub.attempt == 1 and sub.output_ids[0].tolist() == [1, 2]
    assert [op.attempt for op in table.open_streams(record)] == [1]
    # the old attempt's tokens still on their way are dropped, the new one's taken
    assert table.on_delta(delta("a", 2, [3], 2, "c", attempt=0)) is None
    kept = table.on_delta(delta("a", 2, [5], 2, "e", attempt=1))
    assert kept is not None and kept.ids == [5]
    # a scheduler restart after it: the attempt stays, the epoch moves on
    table.new_epoch(2)
    assert table.on_delta(delta("a", 3, [6], 3, "f", epoch=1, attempt=1)) is None
    assert table.on_delta(delta("a", 3, [7], 3, "g", epoch=2, attempt=1)) is not None
    assert record.seqs[0].output_ids == [1, 2, 5, 7] and record.seqs[0].resumed_from == [2, 3]


def test_a_callers_rid_is_refused_in_flight_and_free_again_once_it_left(table) -> None:
    with pytest.raises(InvalidRequestError, match="already in flight"):
        table.add(GenerateRequest("a2", text="again"), "user-a", epoch=1)
    table.remove("a")
    table.add(GenerateRequest("a2", text="again"), "user-a", epoch=1)
    assert table.records["a2"].user_rid == "user-a"


def test_after_a_new_epoch_only_its_tokens_count(table) -> None:
    table.on_delta(delta("a", 0, [1, 2], 0, "ab"))
    table.new_epoch(2)  # the scheduler restarted; "a" resumes from its 2 tokens
    assert table.records["a"].seqs[0].resumed_from == [2]
    # the dead scheduler's tokens past the resume point, still on their way: dropped
    assert table.on_delta(delta("a", 2, [3], 2, "c", epoch=1)) is None
    kept = table.on_delta(delta("a", 2, [7], 2, "g", epoch=2))
    assert kept is not None and kept.ids == [7]
    assert table.records["a"].seqs[0].output_ids == [1, 2, 7]


def test_a_resubmission_carries_each_sequence_and_the_original_budget() -> None:
    table = RequestTable()
    add(table, "m", n=3)
    table.on_delta(SeqDelta("m", 0, 0, (1, 2, 3), 0, "abc", epoch=1))
    table.on_delta(SeqDelta("m", 2, 0, (4,), 0, "d", finish_reason="stop", epoch=1))
    add(table, "untokenized", tokenized=False)
    assert table.resubmission(table.records["untokenized"]) is None
    sub = table.resubmission(table.records["m"])
    assert sub is not None and sub.rid == "m" and sub.input_ids.tolist() == list(range(10, 20))
    assert [o.tolist() for o in sub.output_ids] == [[1, 2, 3], [], [4]]
    assert sub.finished == (2,)
    assert sub.sampling.max_new_tokens == 8, "the original budget: priors count against it"


def test_reopened_streams_hold_the_prompt_tail_prior_output_and_epoch(table) -> None:
    table.on_delta(delta("a", 0, [1, 2], 0, "ab"))
    table.new_epoch(3)
    (stream,) = table.open_streams(table.records["a"])
    assert stream.key == "a/0" and stream.prompt_tail.tolist() == [15, 16, 17, 18, 19]
    assert stream.prior_ids.tolist() == [1, 2] and stream.epoch == 3


def run_to_end(table: RequestTable, record) -> None:
    table.on_delta(delta(record.rid, 0, [1], 0, "x", finish_reason="length"))


@pytest.mark.parametrize("culprit", list("abcdefgh"))
def test_suspects_are_halved_until_the_culprit_is_alone_and_only_it_fails(
    table, culprit: str
) -> None:
    for rid in "bcdefgh":
        add(table, rid)
    # crash 1: eight requests in flight, all resubmitted together (most crashes are transient)
    assert table.on_scheduler_crash() == [] and not table.isolating
    crashes, poisoned = 1, []
    while not poisoned:
        # the culprit is in flight: it crashes the scheduler again
        assert not table.records[culprit].held
        crashes += 1
        assert crashes < 12, "isolation does not converge"
        poisoned = table.on_scheduler_crash()
        assert poisoned or table.isolating, "new requests wait while suspects are told apart"
        while not poisoned and table.records[culprit].held:  # innocents in flight finish
            for record in [r for r in table.live() if not r.held]:
                run_to_end(table, record)
            table.next_group()
    assert [r.rid for r in poisoned] == [culprit]
    assert crashes <= 2 + 3 + 1, "a repeat, then halving: log2(8) more, then alone"
    table.on_refused(Refused(culprit, "RequestFailedError", "poison"))
    while table.live():
        for record in [r for r in table.live() if not r.held]:
            run_to_end(table, record)
        table.next_group()
    assert not table.held and not table.isolating
    assert all(not r.error for rid, r in table.records.items() if rid != culprit)


def test_a_group_readmitted_starts_its_stall_clock_again(table) -> None:
    """A group held back while suspects are told apart waited by design: readmitted
    with its old progress_at, the stall watch took it for stalled at once and sent
    a copy (a warning, a redrive) before the scheduler had seen it."""
    for rid in "bcd":
        add(table, rid)
    table.on_scheduler_crash()
    table.on_scheduler_crash()  # a repeat: half of them held back
    held = [r for r in table.live() if r.held]
    assert held, "a repeat crash holds some back"
    for record in table.live():
        record.progress_at = 0.0  # long ago
    for record in [r for r in table.live() if not r.held]:
        run_to_end(table, record)
    before = time.monotonic()
    readmitted = table.next_group()
    assert readmitted and all(r.progress_at >= before for r in readmitted)


def test_a_request_alone_in_the_scheduler_is_blamed() -> None:
    table = RequestTable(max_crashes=2)
    add(table, "only")
    assert table.on_scheduler_crash() == []
    assert [r.rid for r in table.on_scheduler_crash()] == ["only"]


def test_deaths_outside_a_step_are_charged_to_no_request() -> None:
    table = RequestTable(max_crashes=2)
    add(table, "only")
    add(table, "other")
    for _ in range(5):  # killed while paused, idle or between steps
        assert table.on_scheduler_crash(in_step=False) == []
    assert not table.isolating and not table.held
    run_to_end(table, table.records["other"])
    assert table.on_scheduler_crash() == []  # the first death in a step
    assert [r.rid for r in table.on_scheduler_crash()] == ["only"]


def test_a_suspect_whose_ids_are_unknown_is_never_held_back() -> None:
    table = RequestTable()
    add(table, "a")
    add(table, "b", tokenized=False)  # its Scheduled may still be on its way
    table.on_scheduler_crash()
    table.on_scheduler_crash()
    assert table.records["a"].held and not table.records["b"].held


def test_a_refusal_finishes_the_request(table) -> None:
    table.on_refused(Refused("a", "ContextOverflowError", "too long"))
    record = table.records["a"]
    assert record.finished and record.error is not None and table.live() == []


def test_an_abort_the_frontend_sent_to_hold_a_suspect_back_is_not_an_end(table) -> None:
    table.on_delta(delta("a", 0, [1], 0, "a"))
    assert table.on_delta(delta("a", 1, [], 1, "", finish_reason="abort")) is None
    assert not table.records["a"].finished


def test_a_request_of_n_samples_finishes_with_its_last_and_reopens_one_at_a_time(table) -> None:
    add(table, "n", n=3)
    record = table.records["n"]
    assert [op.index for op in table.open_streams(record)] == [0, 1, 2]
    for index in (2, 0):
        done = SeqDelta("n", index, 0, (1,), 0, "a", finish_reason="length", epoch=1)
        assert table.on_delta(done) is not None
        assert table.on_delta(done) is None and not record.finished  # a repeat counts once
    assert [op.index for op in table.open_streams(record)] == [1]  # the one still going
    assert [op.index for op in table.open_streams(record, 1)] == [1]  # one asked for alone
    assert table.open_streams(record, 0) == []  # ended: nothing to reopen
    last = SeqDelta("n", 1, 0, (1,), 0, "a", finish_reason="stop", epoch=1)
    assert table.on_delta(last) is not None and record.finished and record.ended == 3

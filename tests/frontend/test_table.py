"""The request table merges idempotently and rebuilds what actors lose."""

from __future__ import annotations

import numpy as np
import pytest

from rt.errors import InvalidRequestError
from rt.frontend.table import RequestTable
from rt.gpu.sampling_params import SamplingParams
from rt.messages import GenerateRequest, Refused, SeqDelta, Tokenized


def delta(rid: str, tok_off: int, ids: list[int], txt_off: int, text: str, **kw) -> SeqDelta:
    return SeqDelta(rid, 0, tok_off, tuple(ids), txt_off, text, **kw)


@pytest.fixture
def table() -> RequestTable:
    table = RequestTable(max_crashes=2)
    table.add(GenerateRequest("a", text="hi", sampling=SamplingParams(max_new_tokens=8)))
    assert table.on_tokenized(Tokenized("a", np.arange(10, 20))) is not None
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


def test_a_gap_is_a_bug_not_silently_skipped(table) -> None:
    with pytest.raises(AssertionError, match="gap"):
        table.on_delta(delta("a", 3, [9], 0, ""))


def test_rids_are_unique(table) -> None:
    with pytest.raises(InvalidRequestError, match="already in flight"):
        table.add(GenerateRequest("a", text="again"))


def test_a_resubmission_carries_the_output_and_the_drawn_seed(table) -> None:
    table.on_delta(delta("a", 0, [1, 2, 3], 0, "abc", seed=1234))
    table.add(GenerateRequest("untokenized", text="still at the tokenizer"))
    assert table.resubmission(table.records["untokenized"]) is None
    sub = table.resubmission(table.records["a"])
    assert sub is not None
    assert sub.rid == "a" and sub.input_ids.tolist() == list(range(10, 20))
    assert [o.tolist() for o in sub.output_ids] == [[1, 2, 3]]
    assert sub.sampling.seed == 1234
    assert sub.sampling.max_new_tokens == 5, "the budget left, not the original one"


def test_reopened_streams_hold_the_prompt_tail_and_prior_output(table) -> None:
    table.on_delta(delta("a", 0, [1, 2], 0, "ab"))
    (stream,) = table.open_streams(table.records["a"])
    assert stream.key == "a" and stream.prompt_tail.tolist() == [15, 16, 17, 18, 19]
    assert stream.prior_ids.tolist() == [1, 2]


def test_a_request_stalled_across_crashes_is_poisoned_progress_resets_it(table) -> None:
    table.add(GenerateRequest("b", text="x"))
    table.on_tokenized(Tokenized("b", np.arange(3)))
    assert table.note_scheduler_crash() == []
    table.on_delta(delta("a", 0, [1], 0, "a"))  # a progresses, b does not
    assert [r.rid for r in table.note_scheduler_crash()] == ["b"]


def test_a_refusal_finishes_the_request(table) -> None:
    table.on_refused(Refused("a", "ContextOverflowError", "too long"))
    record = table.records["a"]
    assert record.finished and record.error is not None and table.live() == []

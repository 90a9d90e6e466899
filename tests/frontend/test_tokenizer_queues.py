"""Where each request waiting for its ids stands in its tokenizer's queue
(rt/frontend/tokenizer_queues.py), without processes: the accounting alone."""

from __future__ import annotations

import time

from rt.frontend.tokenizer_queues import TokenizerQueues


def test_a_late_answer_from_another_worker_is_not_credited_to_the_latest_ones_queue() -> None:
    """x went to worker 0, was sent again to worker 1 behind a backlog, then 0's late
    answer came: it was credited to 1 as x's number there, so 1's backlog, still
    queued before it, counted as answered past, and was sent again."""
    queues = TokenizerQueues(2)
    queues.sent(0, "x")
    for i in range(5):
        queues.sent(1, f"b{i}")
    queues.sent(1, "x")  # the stall watch's copy
    now = time.monotonic()
    assert queues.queued("b0", now, timeout=1.0)
    queues.answered("x", worker=0)  # the first copy's answer, late
    assert all(queues.queued(f"b{i}", now, timeout=1.0) for i in range(5))
    queues.answered("b0", worker=1)  # worker 1's own answers move its place
    assert not queues.queued("b0", now, timeout=1.0)
    assert queues.queued("b1", now, timeout=1.0)


def test_an_answer_is_news_of_the_queue_it_came_from() -> None:
    queues = TokenizerQueues(2)
    queues.sent(0, "a")
    queues.sent(0, "b")
    later = time.monotonic() + 5.0  # past the timeout: only news keeps b queued
    assert not queues.queued("b", later, timeout=1.0)
    queues.answered("a", worker=0)
    assert queues.queued("b", time.monotonic(), timeout=1.0)
    assert not queues.queued("a", time.monotonic(), timeout=1.0)  # answered: not waiting


def test_a_copy_sent_to_the_same_worker_is_a_place_of_its_own() -> None:
    """With one worker (the default) the stall watch's copy of R goes behind X in the
    same queue: the answer to R's first send credited the copy's number, past X,
    and X, still queued, looked lost."""
    queues = TokenizerQueues(1)
    queues.sent(0, "R")
    queues.sent(0, "X")
    queues.sent(0, "R")  # the copy
    queues.answered("R", worker=0)  # the first send's answer
    now = time.monotonic()
    assert queues.queued("X", now, timeout=1.0)
    queues.answered("X", worker=0)
    queues.answered("R", worker=0)  # the copy's: credited, nothing of R left
    assert not queues.queued("R", now, timeout=1.0) and not queues._of

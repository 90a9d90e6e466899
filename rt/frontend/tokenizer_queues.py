"""Where each request waiting for its ids stands in its tokenizer's queue.

A tokenizer's ring is FIFO. The frontend numbers the frames it sends to each
tokenizer and notes the latest one answered: a request still waiting for its
ids behind a tokenizer that answers steadily is queued, not lost, and sending
it again would only lengthen the queue (2,737 copies in one second for a batch
of 5,000 prompts). A frame sent after it answered first, or a tokenizer silent
for the stall timeout, says it may be lost. So does nothing: a request still
waiting for room to be sent in (a full ring, a full /dev/shm, no fd) is late.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from rt.actors import SupervisorStatus
from rt.frontend.wiring import live_tokenizers


class TokenizerQueues:
    def __init__(self, workers: int) -> None:
        self._workers = workers
        self._turn = itertools.count()
        self._sent = [0] * workers  # frames sent to each tokenizer
        self._answered = [0] * workers  # the number of the latest one it answered
        self._news_at = [time.monotonic()] * workers  # when it last answered
        self._of: dict[str, tuple[int, int]] = {}  # rid → (tokenizer, number) of its send
        self._sending: set[str] = set()  # waiting for room (a full ring, /dev/shm, fds)

    def choose(self, status: Callable[[], SupervisorStatus]) -> int:
        """The next worker in turn that is alive (any in turn, if none is): requests
        go around one that is stopped, stuck or restarting."""
        turn = next(self._turn)
        if self._workers == 1:
            return 0
        live = live_tokenizers(status(), self._workers)
        return min(live, key=lambda i: (i - turn) % self._workers, default=turn % self._workers)

    def sending(self, rid: str) -> None:
        """``rid`` waits for room in a ring: late, not lost."""
        self._sending.add(rid)

    def unsent(self, rid: str) -> None:
        """The send of ``rid`` ended without sending it (an error, a cancellation)."""
        self._sending.discard(rid)

    def sent(self, worker: int, rid: str) -> None:
        self._sending.discard(rid)
        self._sent[worker] += 1
        self._of[rid] = (worker, self._sent[worker])

    def answered(self, rid: str) -> None:
        sent = self._of.pop(rid, None)
        if sent is not None:
            worker, number = sent
            self._answered[worker] = max(self._answered[worker], number)
            self._news_at[worker] = time.monotonic()

    def forget(self, rid: str) -> None:
        """The request left before its answer: nothing waits for it any more."""
        self._of.pop(rid, None)

    def queued(self, rid: str, now: float, timeout: float) -> bool:
        """Is ``rid`` still behind a backlog its tokenizer is working through (nothing
        sent after it answered yet, and an answer within ``timeout``)?"""
        if rid in self._sending:
            return True
        sent = self._of.get(rid)
        if sent is None:
            return False
        worker, number = sent
        return self._answered[worker] < number and now - self._news_at[worker] < timeout

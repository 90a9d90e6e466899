"""Where each request waiting for its ids stands in its tokenizer's queue.

A tokenizer's ring is FIFO. The frontend numbers the frames it sends to each
tokenizer and notes the latest one answered: a request still waiting for its
ids behind a tokenizer that answers steadily is queued, not lost, and sending
it again would only lengthen the queue (2,737 copies in one second for a batch
of 5,000 prompts). A frame sent after it answered first, or a tokenizer silent
for the stall timeout, says it may be lost. So does nothing: a request still
waiting for room to be sent in (a full ring, a full /dev/shm, no fd) is late.
Nor does a tokenizer silent because it is at work (requests in hand while its
trio thread beats: a long batch, or a stuck one, which the watchdog ends and
whose ring redelivers): a copy sent there would wait behind the same batch,
and each copy of a request that hangs it cost a watchdog kill of its own
(one request held a one-worker server for minutes). Copies go to another
worker, when one is free.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet

from rt.actors import SupervisorStatus
from rt.actors.status import seen_down
from rt.frontend.wiring import live_tokenizers, tokenizer_name

# requests taken before the last beat (the trio thread beats every second at most,
# and work runs on a worker thread; a render's progress() dates its work
# PROGRESS_BACKDATE_S before its beat): a worker at work on them
AT_WORK_S = 0.05
# how often the kernel is asked whether a worker is stopped or dying (/proc: 40 us a
# look; its beat tells it only after SILENT_AFTER_S, 5 s of requests sent there)
DOWN_CHECK_S = 0.05


class TokenizerQueues:
    def __init__(self, workers: int) -> None:
        self._workers = workers
        self._turn = itertools.count()
        self._sent = [0] * workers  # frames sent to each tokenizer
        self._answered = [0] * workers  # the number of the latest one it answered
        self._news_at = [time.monotonic()] * workers  # when it last answered
        # rid → (tokenizer, number) of each of its sends not yet answered, in order
        self._of: dict[str, list[tuple[int, int]]] = {}
        self._sending: set[str] = set()  # waiting for room (a full ring, /dev/shm, fds)
        self._incarnations = [1] * workers  # each worker's, as the last look saw it
        self._down: list[tuple[float, int | None, bool]] = [(-DOWN_CHECK_S, None, False)] * workers

    def choose(self, status: Callable[[], SupervisorStatus], avoid: set[int] | None = None) -> int:
        """The next worker in turn that is alive (any in turn, if none is): requests
        go around one that is stopped, stuck or restarting, and around ``avoid``
        where another is alive."""
        turn = next(self._turn)
        if self._workers == 1:
            return 0
        seen = status()
        live = [i for i in live_tokenizers(seen, self._workers) if not self._seen_down(seen, i)]
        live = [i for i in live if i not in (avoid or ())] or live
        return min(live, key=lambda i: (i - turn) % self._workers, default=turn % self._workers)

    def _seen_down(self, status: SupervisorStatus, worker: int) -> bool:
        """Whether the kernel says ``worker`` is stopped or dying (``seen_down``), as
        a look at most DOWN_CHECK_S old saw it (a SIGSTOPped worker got every other
        request for 5 s: each waited out the stall timeout)."""
        pid = status.actor(tokenizer_name(worker)).pid
        at, seen_pid, down = self._down[worker]
        now = time.monotonic()
        if pid != seen_pid or now - at >= DOWN_CHECK_S:
            down = pid is not None and seen_down(pid) is not None
            self._down[worker] = (now, pid, down)
        return down

    def sending(self, rid: str) -> None:
        """``rid`` waits for room in a ring: late, not lost."""
        self._sending.add(rid)

    def unsent(self, rid: str) -> None:
        """The send of ``rid`` ended without sending it (an error, a cancellation)."""
        self._sending.discard(rid)

    def sent(self, worker: int, rid: str) -> None:
        self._sending.discard(rid)
        self._sent[worker] += 1
        self._of.setdefault(rid, []).append((worker, self._sent[worker]))

    def answered(self, rid: str, worker: int) -> None:
        """``worker`` answered ``rid``: news of its queue, whose place moves to the
        earliest send of ``rid`` there not yet answered (a ring is FIFO). A copy
        the stall watch sent is a send of its own: the answer to the first must
        not credit the copy's number, later in the queue (the requests between
        them looked lost), and the copy's own answer is news of its queue."""
        self._news_at[worker] = time.monotonic()
        sends = self._of.get(rid)
        if not sends:
            return
        mine = next((s for s in sends if s[0] == worker), None)
        if mine is not None:
            sends.remove(mine)
            self._answered[worker] = max(self._answered[worker], mine[1])
        if not sends:
            del self._of[rid]

    def forget(self, rid: str) -> None:
        """The request left (its caller is done): nothing waits for it any more, and
        a copy of it still queued somewhere is no one's place to credit."""
        self._of.pop(rid, None)

    def at_work(self, status: SupervisorStatus) -> set[int]:
        """The live workers holding requests they took before their last beat. A
        worker seen restarted since the last look counts as news: its ring gives
        the new incarnation what the old one had not answered (late, not lost)."""
        now = time.monotonic()
        for i in range(self._workers):
            incarnation = status.actor(tokenizer_name(i)).incarnation
            if incarnation != self._incarnations[i]:
                self._incarnations[i] = incarnation
                self._news_at[i] = now
        found = set()
        for i in live_tokenizers(status, self._workers):
            actor = status.actor(tokenizer_name(i))
            held, beat = actor.handling_age, actor.beat_age
            if held is not None and beat is not None and held > beat + AT_WORK_S:
                found.add(i)
        return found

    def queued(
        self, rid: str, now: float, timeout: float, at_work: AbstractSet[int] = frozenset()
    ) -> bool:
        """Is ``rid`` still behind a backlog its tokenizer is working through (nothing
        sent after it answered yet, and an answer within ``timeout``, or the
        tokenizer at work and no other worker free to take a copy)?"""
        if rid in self._sending:
            return True
        sends = self._of.get(rid)
        if not sends:
            return False
        worker, number = sends[-1]  # its latest send
        if self._answered[worker] >= number:
            return False
        if worker in at_work and len(at_work) >= self._workers:
            return True
        return now - self._news_at[worker] < timeout

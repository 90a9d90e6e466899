"""The request table: one record per live request, the source of truth.

Every actor can die; what the table holds (the original request, the prompt's
ids, every token and character already received) is what their successors are
rebuilt from. Merging is idempotent: a delta carries the offsets of its first
token and character, and only what the table lacks is taken, so redelivered
or regenerated output is never shown twice.

**Epochs.** Each record remembers the scheduler epoch (incarnation) its
streams were last opened at; a delta of an older epoch is dropped, so what a
record holds is always one run's output conditioned on its own prefix, even
when a re-prefill after a restart computes different logits (bfloat16).

**Attempts.** A frame of a request's output lost on its way (a gap: tokens
that start past what the table or the detokenizer holds) is not a failure:
the request is resumed alone from what the table holds, at its next attempt,
and deltas of an older (epoch, attempt) are dropped like those of an older
epoch, for the same reason.

**Quarantine.** A scheduler crash cannot be attributed to one request.
Only a death in a step (inside ``ctx.handling_requests``, as the supervisor
tells) is charged to the requests in flight: one outside a step (a kill while
paused, between steps or idle) ran none of their work, so they are resubmitted
uncharged. After a first charged crash every request in flight is resubmitted together (most
crashes are transient: a kill, the OOM killer). When requests crash it again,
the suspects are isolated by halving: one half is held back (the scheduler is
told to drop their frames), the other readmitted, and new requests wait
until the isolation is over, so the next crash narrows the suspects. A
request is refused as poison only when it was alone in the scheduler at a
crash, having been in flight for ``max_crashes`` of them; innocents finish
with their normal output.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace

import msgspec
import numpy as np

from rt.detok.incremental import CONTEXT_TOKENS
from rt.errors import InvalidRequestError
from rt.messages import (
    GenerateRequest,
    OpenStream,
    Refused,
    Scheduled,
    SeqDelta,
    Tokenized,
)


class OutputGap(Exception):
    """A delta that starts past what the table holds: a frame was lost on its way."""


@dataclass
class SeqState:
    """One output sequence (n > 1 requests have several)."""

    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    seed: int | None = None
    resumed_from: list[int] = field(default_factory=list)  # held tokens at each resumption
    cached: int | None = None  # its prompt's radix hit at its first admission


@dataclass
class Update:
    """What one merge added to one sequence: what a streaming caller is sent."""

    rid: str
    index: int
    ids: list[int]
    text: str
    finished: bool
    stepped_at: float = 0.0  # when the scheduler produced these tokens (time.monotonic())
    offset: int = 0  # where ``ids`` start in the sequence's output


@dataclass
class Record:
    req: GenerateRequest  # its rid is the ring rid: unique, made by the frontend
    user_rid: str  # the caller's rid (or the ring rid when the caller gave none)
    seqs: list[SeqState]
    created: float
    input_ids: np.ndarray | None = None
    truncated: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    first_token_at: float | None = None
    admitted_at: float | None = None  # the scheduler's first admission (time.monotonic())
    prompt_logprobs: tuple[float, ...] | None = None  # of input_ids[1:], when asked for
    prompt_top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None
    finished_at: float | None = None
    error: Refused | None = None
    epoch: int = 0  # the scheduler epoch its streams were last opened at
    attempt: int = 0  # its resumptions alone (after a gap): the attempt its streams are at
    sent_epoch: int = 0  # the scheduler epoch it was last handed to
    crashes: int = 0  # scheduler crashes it was in flight for
    held: bool = False  # held back in quarantine: not in the scheduler
    progress_at: float = 0.0  # its last news (time.monotonic()): sent, ids, tokens
    redrives: int = 0  # times it was sent again for lack of news (a frame lost)
    redriven_at: float = 0.0  # when it was last sent again (time.monotonic())
    ended: int = 0  # its sequences with a finish_reason (finished is asked for every delta)
    dropped: bool = False  # its caller dropped its stream unfinished: aborted a tick later

    @property
    def rid(self) -> str:
        return self.req.rid

    @property
    def finished(self) -> bool:
        return self.error is not None or self.ended == len(self.seqs)


class RequestTable:
    def __init__(self, max_crashes: int = 3) -> None:
        self.records: dict[str, Record] = {}
        self.by_user_rid: dict[str, str] = {}
        self.max_crashes = max_crashes
        self.held: deque[list[str]] = deque()  # groups of suspects held back, next first
        # a request may have been in flight for more than one crash: only then does
        # ``isolating`` look through the table (per request, it made the front O(n²))
        self._repeats = False

    def add(self, req: GenerateRequest, user_rid: str, epoch: int) -> Record:
        """A new request, sent to scheduler ``epoch``. A caller's rid may be used
        again once its request has finished (ended, aborted, refused), though its
        caller may not have read the end yet, or its stream was dropped (``break``
        out of its loop: the abort comes a tick later); while it is in flight it is
        refused."""
        held = self.records.get(self.by_user_rid.get(user_rid, ""))
        if held is not None and not held.finished and not held.dropped:
            raise InvalidRequestError(
                f"rid: {user_rid!r} is already in flight; a rid can be used again once "
                "its request has finished"
            )
        record = Record(
            req, user_rid, [SeqState() for _ in range(req.sampling.n)], time.monotonic()
        )
        record.epoch = record.sent_epoch = epoch
        record.progress_at = record.created
        self.records[req.rid] = record
        self.by_user_rid[user_rid] = req.rid
        return record

    def remove(self, rid: str) -> Record | None:
        record = self.records.pop(rid, None)
        if record is not None and self.by_user_rid.get(record.user_rid) == rid:
            del self.by_user_rid[record.user_rid]  # (not a later request's, under the same)
        return record

    def live(self) -> list[Record]:
        return [r for r in self.records.values() if not r.finished]

    # ---- what arrives -----------------------------------------------------------

    def on_tokenized(self, msg: Tokenized) -> Record | None:
        """Take the prompt's ids; returns the record if they are news (not a duplicate,
        nor the ids of a request that already ended, say refused: a copy sent again)."""
        record = self.records.get(msg.rid)
        if record is None or record.input_ids is not None or record.finished:
            return None
        record.input_ids, record.truncated = msg.input_ids, msg.truncated
        if msg.max_new_tokens:  # the budget the tokenizer set: a resubmission keeps it
            sampling = replace(record.req.sampling, max_new_tokens=msg.max_new_tokens)
            record.req = msgspec.structs.replace(record.req, sampling=sampling)
        record.prompt_tokens = len(msg.input_ids)
        return record

    def on_refused(self, msg: Refused) -> Record | None:
        record = self.records.get(msg.rid)
        if record is not None and not record.finished:
            record.error = msg
            record.finished_at = time.monotonic()
        return record

    def on_delta(self, delta: SeqDelta, stepped_at: float = 0.0) -> Update | None:
        """Merge one delta; return what was new, or None if nothing was. Raises
        OutputGap on a gap (a lost frame: the caller resumes the request)."""
        record = self.records.get(delta.rid)
        if record is None or record.finished or delta.index >= len(record.seqs):
            return None
        if (delta.epoch, delta.attempt) < (record.epoch, record.attempt):
            return None  # a dead scheduler's (or attempt's) tokens past where the next resumed
        seq = record.seqs[delta.index]
        if seq.finish_reason is not None:
            return None
        have = len(seq.output_ids)
        if delta.token_offset > have or delta.text_offset > len(seq.text):
            raise OutputGap(
                f"request {delta.rid}: a gap in the output (tokens from {delta.token_offset} "
                f"with {have} held, text from {delta.text_offset} with {len(seq.text)} held)"
            )
        ids = [int(t) for t in delta.ids[have - delta.token_offset :]]
        text = delta.text[len(seq.text) - delta.text_offset :]
        seq.output_ids += ids
        seq.text += text
        if delta.logprobs is not None:
            seq.logprobs += [float(x) for x in delta.logprobs[have - delta.token_offset :]]
        if delta.top_logprobs is not None:
            seq.top_logprobs += delta.top_logprobs[have - delta.token_offset :]
        if ids and record.first_token_at is None:
            record.first_token_at = time.monotonic()
        if delta.admitted_at and record.admitted_at is None:
            record.admitted_at = delta.admitted_at
        if delta.prompt_logprobs is not None and record.prompt_logprobs is None:
            record.prompt_logprobs = tuple(float(x) for x in delta.prompt_logprobs)
            if delta.prompt_top_logprobs is not None:
                record.prompt_top_logprobs = tuple(
                    tuple((int(t), float(lp)) for t, lp in alts)
                    for alts in delta.prompt_top_logprobs
                )
        seq.seed = delta.seed if seq.seed is None else seq.seed
        record.prompt_tokens = delta.prompt_tokens or record.prompt_tokens
        if delta.admitted_at and seq.cached is None:
            seq.cached = delta.cached_tokens
            # the request's hit is the least of its samples' (the first admitted's): the
            # later ones also find what their siblings computed, no cache's when it came
            record.cached_tokens = min(c.cached for c in record.seqs if c.cached is not None)
        # "abort" is the scheduler's answer to an Abort the frontend sent: to a caller
        # who left (the record is gone), or to hold a suspect back (not an end)
        finished = delta.finish_reason not in (None, "abort")
        if finished:
            seq.finish_reason, seq.matched_stop = delta.finish_reason, delta.matched_stop
            record.ended += 1  # (once: a finished sequence takes no more deltas, above)
            if record.finished:
                record.finished_at = time.monotonic()
        if not ids and not text and not finished:
            return None
        return Update(delta.rid, delta.index, ids, text, finished, stepped_at, have)

    # ---- recovery ---------------------------------------------------------------

    def resubmission(self, record: Record) -> Scheduled | None:
        """``record`` as prompt + tokens so far, per sequence, with its original
        parameters and seed (None: its prompt ids are not known yet)."""
        if record.input_ids is None:
            return None
        sampling = record.req.sampling
        if sampling.seed is None and record.seqs[0].seed is not None:
            sampling = replace(sampling, seed=record.seqs[0].seed)  # child 0 keeps the seed
        if record.prompt_logprobs is not None:
            sampling = replace(sampling, prompt_logprobs=False)  # the table has them
        prior = tuple(np.asarray(s.output_ids, dtype=np.int64) for s in record.seqs)
        done = tuple(i for i, s in enumerate(record.seqs) if s.finish_reason is not None)
        return Scheduled(
            record.rid,
            record.input_ids,
            sampling,
            record.req.priority,
            prior,
            done,
            attempt=record.attempt,
            to_context=record.req.to_context,
        )

    def new_epoch(self, epoch: int) -> None:
        """A scheduler restarted: from now on only tokens of ``epoch`` count for every
        live request (reopen their streams), each resuming from what it holds."""
        for record in self.live():
            record.epoch = epoch
            for seq in record.seqs:
                if seq.finish_reason is None:
                    seq.resumed_from.append(len(seq.output_ids))

    def new_attempt(self, record: Record) -> None:
        """``record`` lost a frame of its output: from now on only tokens of its next
        attempt count (reopen its streams, resubmit it), resuming from what it holds."""
        record.attempt += 1
        for seq in record.seqs:
            if seq.finish_reason is None:
                seq.resumed_from.append(len(seq.output_ids))

    def open_streams(self, record: Record, index: int | None = None) -> list[OpenStream]:
        """The detokenizer streams of one request (or its sample ``index`` alone) at
        its epoch, with the output it already has (empty for a new request; after
        a restart, its rebuild)."""
        assert record.input_ids is not None
        tail = record.input_ids[-CONTEXT_TOKENS:]
        which = range(len(record.seqs)) if index is None else (index,)
        return [
            OpenStream(
                record.rid,
                i,
                tail,
                record.req.detok,
                np.asarray(record.seqs[i].output_ids, dtype=np.int64),
                record.epoch,
                record.attempt,
            )
            for i in which
            if record.seqs[i].finish_reason is None
        ]

    def on_scheduler_crash(self, in_step: bool = True) -> list[Record]:
        """A scheduler died with the requests not held back in flight. Returns the
        poisoned ones (to fail alone); the others stay in flight (a first crash)
        or are split in two halves, the second held back (a repeat crash). A
        death outside a step (``in_step`` false) is charged to none of them."""
        in_flight = [r for r in self.live() if not r.held]
        if not in_step:
            return []
        for record in in_flight:
            record.crashes += 1
            self._repeats = self._repeats or record.crashes > 1
        if len(in_flight) == 1 and in_flight[0].crashes >= self.max_crashes:
            return in_flight  # alone in the scheduler: it is the culprit
        if len(in_flight) > 1 and any(r.crashes > 1 for r in in_flight):
            # Held records are aborted at the scheduler: only those whose ids are known
            # (their Scheduled reached a scheduler), so none runs unwatched.
            known = [r for r in in_flight if r.input_ids is not None]
            hold = known[len(known) - min(len(in_flight) // 2, len(known)) :]
            for record in hold:
                record.held = True
            if hold:
                self.held.appendleft([r.rid for r in hold])
        return []

    @property
    def isolating(self) -> bool:
        """Suspects are being isolated: new requests wait, so as not to mix in."""
        if self.held:
            return True
        if self._repeats:
            self._repeats = any(r.crashes > 1 for r in self.live() if not r.held)
        return self._repeats

    def next_group(self) -> list[Record]:
        """Once nothing is in flight, the next group held back, to readmit together."""
        if not self.held or any(not r.held for r in self.live()):
            return []
        while self.held:
            group = [self.records.get(rid) for rid in self.held.popleft()]
            live = [r for r in group if r is not None and not r.finished]
            if live:
                now = time.monotonic()  # its wait held back is no stall: its clock restarts
                for record in live:
                    record.held, record.progress_at = False, now
                return live
        return []

"""The request table: one record per live request, the source of truth.

Every actor can die; what the table holds (the original request, the prompt's
ids, every token and character already received) is what their successors are
rebuilt from. Merging is idempotent: a delta carries the offsets of its first
token and character, and only what the table lacks is taken, so redelivered
or regenerated output is never shown twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

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


@dataclass
class Update:
    """What one merge added to one sequence: what a streaming caller is sent."""

    rid: str
    index: int
    ids: list[int]
    text: str
    finished: bool
    stepped_at: float = 0.0  # when the scheduler produced these tokens (time.monotonic())


@dataclass
class Record:
    req: GenerateRequest
    seqs: list[SeqState]
    created: float
    input_ids: np.ndarray | None = None
    truncated: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    first_token_at: float | None = None
    finished_at: float | None = None
    error: Refused | None = None
    stalled_crashes: int = 0  # scheduler crashes in a row with no new token in between
    epoch: int = 0  # the scheduler incarnation (as the frontend counts) it was last sent to

    @property
    def rid(self) -> str:
        return self.req.rid

    @property
    def finished(self) -> bool:
        return self.error is not None or all(s.finish_reason is not None for s in self.seqs)


class RequestTable:
    def __init__(self, max_crashes: int = 3) -> None:
        self.records: dict[str, Record] = {}
        self.max_crashes = max_crashes

    def add(self, req: GenerateRequest) -> Record:
        if req.rid in self.records:
            raise InvalidRequestError(f"rid: {req.rid!r} is already in flight; rids must be unique")
        record = Record(req, [SeqState() for _ in range(req.sampling.n)], time.monotonic())
        self.records[req.rid] = record
        return record

    def remove(self, rid: str) -> Record | None:
        return self.records.pop(rid, None)

    def live(self) -> list[Record]:
        return [r for r in self.records.values() if not r.finished]

    # ---- what arrives -----------------------------------------------------------

    def on_tokenized(self, msg: Tokenized) -> Record | None:
        """Take the prompt's ids; returns the record if they are news (not a duplicate)."""
        record = self.records.get(msg.rid)
        if record is None or record.input_ids is not None:
            return None
        record.input_ids, record.truncated = msg.input_ids, msg.truncated
        record.prompt_tokens = len(msg.input_ids)
        return record

    def on_refused(self, msg: Refused) -> Record | None:
        record = self.records.get(msg.rid)
        if record is not None and not record.finished:
            record.error = msg
            record.finished_at = time.monotonic()
        return record

    def on_delta(self, delta: SeqDelta, stepped_at: float = 0.0) -> Update | None:
        """Merge one delta; return what was new, or None if nothing was."""
        record = self.records.get(delta.rid)
        if record is None or record.finished or delta.index >= len(record.seqs):
            return None
        seq = record.seqs[delta.index]
        if seq.finish_reason is not None:
            return None
        have = len(seq.output_ids)
        if delta.token_offset > have or delta.text_offset > len(seq.text):
            raise AssertionError(
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
        if ids:
            record.stalled_crashes = 0
            if record.first_token_at is None:
                record.first_token_at = time.monotonic()
        seq.seed = delta.seed if seq.seed is None else seq.seed
        record.prompt_tokens = delta.prompt_tokens or record.prompt_tokens
        record.cached_tokens = max(record.cached_tokens, delta.cached_tokens)
        finished = delta.finish_reason is not None
        if finished:
            seq.finish_reason, seq.matched_stop = delta.finish_reason, delta.matched_stop
            if record.finished:
                record.finished_at = time.monotonic()
        if not ids and not text and not finished:
            return None
        return Update(delta.rid, delta.index, ids, text, finished, stepped_at)

    # ---- recovery ---------------------------------------------------------------

    def resubmission(self, record: Record) -> Scheduled | None:
        """After a scheduler crash: ``record`` as prompt + tokens so far, with the
        remaining budget and the same seed (None: its prompt ids are not known yet,
        or its last token is already on its way).

        A request with ``n > 1`` starts again from its prompt: its sequences hold
        different outputs, and with its seed it regenerates the same tokens, which
        the merge recognises by offset."""
        if record.input_ids is None:
            return None
        sampling = record.req.sampling
        if sampling.seed is None and record.seqs[0].seed is not None:
            sampling = replace(sampling, seed=record.seqs[0].seed)
        prior: tuple[np.ndarray, ...] = ()
        if sampling.n == 1:
            done = len(record.seqs[0].output_ids)
            if done >= sampling.max_new_tokens:
                return None
            sampling = replace(
                sampling,
                max_new_tokens=sampling.max_new_tokens - done,
                min_new_tokens=max(0, sampling.min_new_tokens - done),
            )
            prior = (np.asarray(record.seqs[0].output_ids, dtype=np.int64),)
        return Scheduled(record.rid, record.input_ids, sampling, record.req.priority, prior)

    def open_streams(self, record: Record) -> list[OpenStream]:
        """The detokenizer streams of one request, with the output it already has
        (empty for a new request; after a detokenizer restart, its rebuild)."""
        assert record.input_ids is not None
        tail = record.input_ids[-CONTEXT_TOKENS:]
        return [
            OpenStream(
                record.rid,
                i,
                tail,
                record.req.detok,
                np.asarray(seq.output_ids, dtype=np.int64),
            )
            for i, seq in enumerate(record.seqs)
            if seq.finish_reason is None
        ]

    def note_scheduler_crash(self) -> list[Record]:
        """Count a scheduler crash against every live, scheduled request; return
        those in flight for ``max_crashes`` crashes in a row without a new token
        (poison suspects: they fail alone, the rest are resubmitted)."""
        poisoned = []
        for record in self.live():
            if record.input_ids is None:
                continue
            record.stalled_crashes += 1
            if record.stalled_crashes >= self.max_crashes:
                poisoned.append(record)
        return poisoned

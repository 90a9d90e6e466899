"""The detokenizer actor: scheduler tokens in, text deltas out to the frontend.

Two inboxes, the scheduler's step frames and the frontend's stream control
(open with the prompt tail and the tokens the frontend holds, close), feed
one handler task in arrival order; it alone changes state and sends, so the
frontend's ring has one sender. Its first frame, ``DetokenizerUp``, tells the
frontend that everything after it is this incarnation's: the frontend then
reopens every live stream, and a successor rebuilds its decode state from
those opens and re-reads the step frames its predecessor had not committed
(duplicates are skipped by offset).

**Commit means done.** Tokens that cannot be decoded yet are *parked*: their
stream is not open here (the frontend opens it once it has the prompt's ids,
and the scheduler is often faster), or they come from a newer run than the
stream was opened at (the frontend reopens every stream after a scheduler
restart, and a request's after a resumption), or a frame before them is
missing here (a successor waiting for its reopen, or a lost frame). A step frame is committed only once nothing of it is
parked: a detokenizer that dies with parked tokens leaves their frames in the
ring for its successor. For a stream with parked tokens and no open, the
detokenizer asks the frontend (``StreamDeltas.unknown``), which answers with
a close if the request has ended, so nothing is parked forever.

Tokens of an older *run* than their stream's are dropped: after a scheduler
restart only the new incarnation's continuation of what the frontend holds
counts (no splicing of two runs). A run is the pair (scheduler epoch, the
request's attempt): a request is resumed alone, at its next attempt, when a
frame of its output was lost. The detokenizer sees such a loss as tokens that
start past what their stream has (a *gap*): it parks them, and tells the
frontend once per stream and run (``StreamDeltas.gaps``), which resumes the
request from the tokens it holds and reopens its streams at the new attempt.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import trio

from rt.actors import Actor, ActorContext
from rt.detok.incremental import IncrementalDetokenizer, TextDelta, TokenUpdate
from rt.errors import RequestFailedError
from rt.messages import (
    CloseStream,
    DetokenizerUp,
    DetokStats,
    OpenStream,
    Refused,
    SeqDelta,
    SeqTokens,
    StepTokens,
    StreamDeltas,
    stream_key,
)
from rt.pipeline.mail import receive, send
from rt.shm import Frame
from rt.tok.core import refuse
from rt.tok.load import load_tokenizer

log = logging.getLogger(__name__)
STEPS, CONTROL, OUT = "sched-detok", "front-detok", "detok-front"
IDLE_REPORT_S = 0.05  # report the counts once nothing has arrived for this long


@dataclass(eq=False)
class _StepFrame:
    """A received step frame and how many of its sequences are still parked."""

    frame: Frame
    parked: int = 0


@dataclass(eq=False)
class _Parked:
    """One sequence's tokens from one step frame, on its way to being decoded."""

    seq: SeqTokens
    run: tuple[int, int]  # (scheduler epoch, the request's attempt)
    stepped_at: float
    source: _StepFrame
    held: bool = False  # counted in source.parked


@dataclass
class _Stream:
    rid: str
    index: int
    run: tuple[int, int]  # (scheduler epoch, the request's attempt) it was opened at
    parked: list[_Parked] = field(default_factory=list)
    gap_told: bool = False  # the frontend was told of a gap in this run


def _incremental(tokenizer_path: str) -> IncrementalDetokenizer:
    return IncrementalDetokenizer(load_tokenizer(tokenizer_path))


class DetokenizerActor(Actor):
    def __init__(self, tokenizer_path: str) -> None:
        self.tokenizer_path = tokenizer_path

    async def startup(self, ctx: ActorContext) -> None:
        # on a worker thread: the trio thread beats meanwhile (rt/actors/child.py)
        self.detok = await trio.to_thread.run_sync(_incremental, self.tokenizer_path)
        self.streams: dict[str, _Stream] = {}  # open here
        self.unopened: dict[str, list[_Parked]] = defaultdict(list)  # parked, no open yet
        self.asked: set[str] = set()  # unopened keys the frontend was asked about
        self.frames: deque[_StepFrame] = deque()  # received, not committed, in order
        self.gaps: list[tuple[str, int, int]] = []  # to tell the frontend with the next frame

    async def run(self, ctx: ActorContext) -> None:
        await send(ctx.outbox[OUT], DetokenizerUp(ctx.incarnation))
        send_channel, receive_channel = trio.open_memory_channel[tuple[str, Any, Frame]](0)
        async with trio.open_nursery() as nursery:
            for name in (STEPS, CONTROL):
                nursery.start_soon(self._receive, ctx, name, send_channel.clone())
            send_channel.close()
            await self._handle(ctx, receive_channel)

    async def _receive(
        self, ctx: ActorContext, name: str, out: trio.MemorySendChannel[tuple[str, Any, Frame]]
    ) -> None:
        inbox = ctx.inbox[name]
        async with out:
            while True:
                msg, frame = await receive(inbox)
                await out.send((name, msg, frame))

    async def _handle(
        self, ctx: ActorContext, items: trio.MemoryReceiveChannel[tuple[str, Any, Frame]]
    ) -> None:
        """The one task that changes state and sends, in arrival order."""
        dirty = False
        while True:
            item = None
            with trio.move_on_after(IDLE_REPORT_S if dirty else math.inf):
                item = await items.receive()  # only the wait: a send must never be cut short
            if item is None:  # idle for a while: report what is held
                await send(ctx.outbox[OUT], StreamDeltas((), detok=self.stats()))
                dirty = False
                continue
            name, msg, frame = item
            out = self._on_step(msg, frame) if name == STEPS else self._on_control(msg)
            if out is not None:
                await send(ctx.outbox[OUT], out)
            if name == CONTROL:
                ctx.inbox[CONTROL].commit(frame)
            self._commit_steps(ctx)  # an open or close may release parked frames too
            dirty = True

    # ---- step frames --------------------------------------------------------------

    def _on_step(self, msg: Any, frame: Frame) -> StreamDeltas | None:
        if not isinstance(msg, StepTokens):
            log.error("dropped a %s frame on %s", type(msg).__name__, STEPS)
            self.frames.append(_StepFrame(frame))
            return None
        source = _StepFrame(frame)
        self.frames.append(source)
        items = [_Parked(seq, (msg.epoch, seq.attempt), msg.stepped_at, source) for seq in msg.seqs]
        deltas, refused = self._apply(self._admit(items))
        unknown = tuple(sorted(k for k in self.unopened if k not in self.asked))
        self.asked.update(unknown)
        gaps, self.gaps = tuple(self.gaps), []
        if not (deltas or refused or msg.refused or msg.stats or unknown or gaps):
            return None
        return StreamDeltas(
            tuple(deltas),
            (*msg.refused, *refused),
            msg.stats,
            msg.stepped_at,
            unknown,
            # with the scheduler's reports (each second while busy) and at idle: a walk
            # over every stream, which each step of 100k streams paid for
            self.stats() if msg.stats is not None else None,
            gaps,
        )

    def _admit(self, items: list[_Parked]) -> list[_Parked]:
        """Those of ``items`` that can be decoded now; the others are parked, or
        dropped if older than their stream's run (the stream was reopened past
        them after a scheduler restart or a resumption)."""
        ready = []
        for item in items:
            key = stream_key(item.seq.rid, item.seq.index)
            stream = self.streams.get(key)
            if stream is not None and item.run < stream.run:
                self._release([item])
            elif stream is None or item.run > stream.run or stream.parked:
                self._park(key, item)
            else:
                ready.append(item)
        return ready

    def _park(self, key: str, item: _Parked) -> None:
        if not item.held:
            item.held = True
            item.source.parked += 1
        stream = self.streams.get(key)
        (stream.parked if stream is not None else self.unopened[key]).append(item)

    @staticmethod
    def _release(items: list[_Parked]) -> None:
        for item in items:
            if item.held:
                item.held = False
                item.source.parked -= 1

    def _commit_steps(self, ctx: ActorContext) -> None:
        """Commit the received step frames up to the first that still has parked tokens."""
        last = None
        while self.frames and self.frames[0].parked == 0:
            last = self.frames.popleft().frame
        if last is not None:
            ctx.inbox[STEPS].commit(last)

    # ---- stream control ----------------------------------------------------------------

    def _on_control(self, msg: Any) -> StreamDeltas | None:
        if isinstance(msg, OpenStream):
            return self._open(msg)
        if isinstance(msg, CloseStream):
            self._close(msg.key)
        else:
            log.error("dropped a %s frame on %s", type(msg).__name__, CONTROL)
        return None

    def _open(self, msg: OpenStream) -> StreamDeltas | None:
        key = msg.key
        stream = self.streams.get(key)
        deltas: list[SeqDelta] = []
        refused: list[Refused] = []
        run = (msg.epoch, msg.attempt)
        try:
            if stream is not None and run > stream.run:
                self.detok.close(key)  # rebuilt below from what the frontend holds
                stream.run, stream.gap_told = run, False
            elif stream is None:
                stream = self.streams[key] = _Stream(msg.rid, msg.index, run)
                stream.parked = self.unopened.pop(key, [])
                self.asked.discard(key)
            merged = self.detok.open(
                key, msg.prompt_tail.tolist(), msg.detok, msg.prior_ids.tolist()
            )
            deltas = [self._opened(stream, d) for d in merged]
        except Exception as err:  # one stream's fault: refuse its request alone
            refused.append(self._refusal(msg.rid, err))
            self._close(key)
            return StreamDeltas((), tuple(refused), detok=self.stats())
        parked, stream.parked = stream.parked, []
        ready = self._admit(parked)
        more, refused = self._apply(ready)
        deltas += more
        stepped_at = max((p.stepped_at for p in ready), default=0.0)
        gaps, self.gaps = tuple(self.gaps), []
        if not deltas and not refused and not gaps:
            return None
        return StreamDeltas(tuple(deltas), tuple(refused), stepped_at=stepped_at, gaps=gaps)

    def _close(self, key: str) -> None:
        self.detok.close(key)
        stream = self.streams.pop(key, None)
        self._release(stream.parked if stream is not None else [])
        self._release(self.unopened.pop(key, []))
        self.asked.discard(key)

    def stats(self) -> DetokStats:
        parked = sum(len(s.parked) for s in self.streams.values())
        parked += sum(len(items) for items in self.unopened.values())
        return DetokStats(streams=len(self.streams), parked=parked)

    # ---- decoding -----------------------------------------------------------------------

    def _opened(self, stream: _Stream, delta: TextDelta) -> SeqDelta:
        """A delta from merging an open's prior ids: no step record behind it."""
        src = SeqTokens(stream.rid, stream.index, delta.token_offset, tuple(delta.ids))
        return _seq_delta(delta, src, stream.run)

    def _apply(self, items: list[_Parked]) -> tuple[list[SeqDelta], list[Refused]]:
        """Detokenize a batch, releasing each item's hold on its frame. A sequence
        may appear more than once (tokens that were parked): each round holds a
        sequence at most once, so every delta maps back to its step record. A
        sequence whose tokens start past what its stream has is parked again (a
        successor waiting for its reopen, or a lost frame: the frontend is told);
        one that makes decoding fail is refused alone."""
        rounds: list[dict[str, _Parked]] = []
        for item in items:
            key = stream_key(item.seq.rid, item.seq.index)
            for round_ in rounds:
                if key not in round_:
                    round_[key] = item
                    break
            else:
                rounds.append({key: item})
        out: list[SeqDelta] = []
        refused: list[Refused] = []
        for round_ in rounds:
            for key, item in list(round_.items()):
                stream = self.streams.get(key)
                if stream is None or self.detok.finished(key):
                    # closed or refused by an earlier round, or ended here by a stop
                    # string while the scheduler, which matches none, went on (a gap
                    # that would never fill: parked, it held its frame, and every later
                    # one, uncommitted until the whole request ended)
                    del round_[key]
                    self._release([item])
                elif stream.parked or item.seq.token_offset > self.detok.output_len(key):
                    if not stream.parked and not stream.gap_told:  # this one is the gap
                        stream.gap_told = True
                        self.gaps.append((key, *stream.run))
                    del round_[key]  # wait for a reopen with what came before
                    self._park(key, item)
            updates = [
                TokenUpdate(
                    key,
                    p.seq.token_offset,
                    p.seq.ids,
                    finished=_ends(p.seq),
                    stop_token=p.seq.finish_reason == "stop"
                    and isinstance(p.seq.matched_stop, int),
                )
                for key, p in round_.items()
            ]
            try:
                results = self.detok.step(updates)
            except Exception:
                results = self._step_apart(updates, refused)
            for delta in results:
                item = round_[delta.rid]
                out.append(_seq_delta(delta, item.seq, self.streams[delta.rid].run))
            self._release(list(round_.values()))
        return out, refused

    def _step_apart(self, updates: list[TokenUpdate], refused: list[Refused]) -> list[TextDelta]:
        """A batch that failed: each update alone, refusing the requests whose fail."""
        results: list[TextDelta] = []
        for update in updates:
            try:
                results += self.detok.step([update])
            except Exception as err:
                stream = self.streams[update.rid]
                refused.append(self._refusal(stream.rid, err))
                for index_key in [k for k, s in self.streams.items() if s.rid == stream.rid]:
                    self._close(index_key)
        return [d for d in results if d.rid in self.streams]

    @staticmethod
    def _refusal(rid: str, err: Exception) -> Refused:
        log.exception("request %s: detokenization failed; refusing it alone", rid)
        return refuse(
            rid, RequestFailedError(f"request {rid}: detokenization failed: {type(err).__name__}")
        )


def _ends(seq: SeqTokens) -> bool:
    """Whether ``seq`` ends its stream. An "abort" does not: the frontend sends one
    to a caller who left (the stream is closed anyway) or to hold a suspect of a
    scheduler crash back, and a suspect is readmitted later on the same stream."""
    return seq.finish_reason not in (None, "abort")


def _seq_delta(delta: TextDelta, src: SeqTokens, run: tuple[int, int]) -> SeqDelta:
    reason: str | None = src.finish_reason
    matched: int | str | None = src.matched_stop
    if delta.stop_matched is not None:
        reason, matched = "stop", delta.stop_matched
    skip = delta.token_offset - src.token_offset  # tokens of src the detokenizer had already
    return SeqDelta(
        rid=src.rid,
        index=src.index,
        token_offset=delta.token_offset,
        ids=tuple(delta.ids),
        text_offset=delta.text_offset,
        text=delta.text,
        finish_reason=reason if delta.finished else None,
        matched_stop=matched if delta.finished else None,
        logprobs=src.logprobs[skip:] if src.logprobs is not None else None,
        top_logprobs=src.top_logprobs[skip:] if src.top_logprobs is not None else None,
        prompt_tokens=src.prompt_tokens,
        cached_tokens=src.cached_tokens,
        seed=src.seed,
        epoch=run[0],
        attempt=run[1],
        admitted_at=src.admitted_at,
        prompt_logprobs=src.prompt_logprobs,
        prompt_top_logprobs=src.prompt_top_logprobs,
    )

"""The detokenizer actor: scheduler tokens in, text deltas out to the frontend.

Two inboxes: the scheduler's step frames, and the frontend's stream control
(open with the prompt tail, close). Tokens for a stream that is not open yet
wait for its open; a restarted detokenizer is sent an open for every live
stream, with the output the frontend already holds, and re-reads the step
frames its predecessor had not committed (duplicates are skipped by offset).
A step frame is committed once its deltas are in the frontend's ring.
"""

from __future__ import annotations

from collections import defaultdict

import trio

from rt.actors import Actor, ActorContext
from rt.detok.incremental import IncrementalDetokenizer, TextDelta, TokenUpdate
from rt.messages import (
    CloseStream,
    OpenStream,
    SeqDelta,
    SeqTokens,
    StepTokens,
    StreamDeltas,
    stream_key,
)
from rt.pipeline.mail import receive, send
from rt.tok.load import load_tokenizer

STEPS, CONTROL, OUT = "sched-detok", "front-detok", "detok-front"


class DetokenizerActor(Actor):
    def __init__(self, tokenizer_path: str) -> None:
        self.tokenizer_path = tokenizer_path

    async def startup(self, ctx: ActorContext) -> None:
        tokenizer = load_tokenizer(self.tokenizer_path)
        self.detok = IncrementalDetokenizer(tokenizer)
        self.waiting: dict[str, list[SeqTokens]] = defaultdict(list)  # tokens before their open
        self.waiting_since: dict[str, float] = {}  # the first waiting step's time, per stream
        self.keys: dict[str, tuple[str, int]] = {}  # stream key -> (rid, index)

    async def run(self, ctx: ActorContext) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._control, ctx)
            await self._steps(ctx)

    async def _control(self, ctx: ActorContext) -> None:
        inbox = ctx.inbox[CONTROL]
        while True:
            msg, frame = await receive(inbox)
            deltas: list[SeqDelta] = []
            stepped_at = 0.0  # unknown: no step behind these deltas
            if isinstance(msg, OpenStream):
                self.keys[msg.key] = (msg.rid, msg.index)
                merged = self.detok.open(
                    msg.key, msg.prompt_tail.tolist(), msg.detok, msg.prior_ids.tolist()
                )
                deltas = [self._opened(msg.key, d) for d in merged]
                early = self.waiting.pop(msg.key, [])
                stepped_at = self.waiting_since.pop(msg.key, 0.0)
                if early:
                    deltas += self._apply(early)
            elif isinstance(msg, CloseStream):
                self.detok.close(msg.key)
                self.waiting.pop(msg.key, None)
                self.waiting_since.pop(msg.key, None)
                self.keys.pop(msg.key, None)
            if deltas:
                await send(ctx.outbox[OUT], StreamDeltas(tuple(deltas), stepped_at=stepped_at))
            inbox.commit(frame)

    async def _steps(self, ctx: ActorContext) -> None:
        inbox = ctx.inbox[STEPS]
        while True:
            msg, frame = await receive(inbox)
            assert isinstance(msg, StepTokens), f"unexpected {type(msg).__name__} on {STEPS}"
            ready = []
            for seq in msg.seqs:
                if stream_key(seq.rid, seq.index) in self.detok:
                    ready.append(seq)
                else:
                    key = stream_key(seq.rid, seq.index)
                    self.waiting[key].append(seq)
                    self.waiting_since.setdefault(key, msg.stepped_at)
            deltas = self._apply(ready)
            if deltas or msg.refused or msg.stats:
                await send(
                    ctx.outbox[OUT],
                    StreamDeltas(tuple(deltas), msg.refused, msg.stats, msg.stepped_at),
                )
            inbox.commit(frame)

    def _opened(self, key: str, delta: TextDelta) -> SeqDelta:
        """A delta from merging an open's prior ids: no step record behind it."""
        rid, index = self.keys[key]
        src = SeqTokens(rid, index, delta.token_offset, tuple(delta.ids))
        return _seq_delta(delta, src)

    def _apply(self, seqs: list[SeqTokens]) -> list[SeqDelta]:
        """Detokenize a batch. A sequence may appear in it more than once (tokens
        that waited for their open): each round holds a sequence at most once,
        so every delta maps back to the step record it came from."""
        rounds: list[dict[str, SeqTokens]] = []
        for seq in seqs:
            key = stream_key(seq.rid, seq.index)
            for round_ in rounds:
                if key not in round_:
                    round_[key] = seq
                    break
            else:
                rounds.append({key: seq})
        out = []
        for round_ in rounds:
            updates = [
                TokenUpdate(key, s.token_offset, s.ids, finished=s.finish_reason is not None)
                for key, s in round_.items()
            ]
            for delta in self.detok.step(updates):
                out.append(_seq_delta(delta, round_[delta.rid]))
        return out


def _seq_delta(delta: TextDelta, src: SeqTokens) -> SeqDelta:
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
    )

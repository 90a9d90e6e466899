"""The tokenizer worker actor: prompts from the frontend → ids for the scheduler.

Dynamic batching: after the first request arrives, every request already
queued joins its batch at once; only when a queue has formed (the batch holds
more than one) does the worker wait up to ``batch_wait_s`` for more, up to
``max_batch``. An idle worker adds no wait.

Whatever one request makes raise is its refusal (``TokenizerCore``). What is
left is the process dying with a batch in hand (a segfault in the Rust
tokenizer, the OOM killer), which no ``except`` sees. A batch marks only its
first frame (``Inbox.mark``): any of its frames may be the culprit. A successor
that finds that mark raised retries the frames from there (the dead batch's,
and any that joined since: it cannot tell them apart) one at a time, each
marked, handled, sent and committed alone, so that the next death names its
culprit. A request is refused (RequestFailedError) once ``max_crashes`` workers
died with it in hand, one at least with it alone, so a batch's innocents never
are. These deaths are charged to the requests (``ctx.handling_requests``), not
to the restart intensity: a flood of poison cannot stop the engine.

Each frame is committed once what it caused is in the scheduler's and the
frontend's rings; they recognise a result sent twice by its rid.
"""

from __future__ import annotations

import logging

import trio

from rt.actors import Actor, ActorContext
from rt.actors.mailbox import Inbox
from rt.errors import (
    Broken,
    EndOfChannel,
    InvalidRequestError,
    RequestFailedError,
    ResourceExhausted,
    SegmentError,
    WouldBlock,
    refused_for_room,
)
from rt.messages import GenerateRequest, Refused
from rt.pipeline.mail import RETRY_S, send, unreadable_side
from rt.shm import Frame, codec
from rt.tok.core import Result, TokenizerCore, refuse
from rt.tok.load import load_tokenizer

log = logging.getLogger(__name__)
THREAD_CHARS = 1 << 20  # a batch with more text than this is tokenized in a worker thread

# What handling one frame comes to: its results, a refusal, or nothing (noise dropped).
Outcome = Result | None


class TokenizerActor(Actor):
    fault_points = frozenset({"tokenize"})

    def __init__(
        self,
        index: int,
        tokenizer_path: str,
        context_length: int,
        vocab_size: int,
        max_batch: int = 64,
        batch_wait_s: float = 0.002,
        max_crashes: int = 3,
        chat_template: str | None = None,
        render_limit_s: float = 0.0,
    ) -> None:
        self.inbox = f"front-tok{index}"
        self.to_scheduler = f"tok{index}-sched"
        self.to_frontend = f"tok{index}-front"
        self.tokenizer_path = tokenizer_path
        self.context_length = context_length
        self.vocab_size = vocab_size
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.max_crashes = max_crashes
        self.chat_template = chat_template  # the text; None: the tokenizer's own
        self.render_limit_s = render_limit_s  # a chat template's render, at most (0: no limit)

    async def startup(self, ctx: ActorContext) -> None:
        # on a worker thread: the trio thread beats meanwhile (rt/actors/child.py)
        self.core = await trio.to_thread.run_sync(self._load)

    def _load(self) -> TokenizerCore:
        tokenizer = load_tokenizer(self.tokenizer_path)
        if self.chat_template is not None:
            tokenizer.chat_template = self.chat_template
        return TokenizerCore(tokenizer, self.context_length, self.vocab_size, self.render_limit_s)

    async def run(self, ctx: ActorContext) -> None:
        inbox = ctx.inbox[self.inbox]
        while True:
            frames = await self._batch(inbox)
            crashes = inbox.mark(frames[0])
            if crashes == 1:
                await self._handle_batch(ctx, frames)
            else:  # a predecessor died in a batch that started here
                await self._handle_apart(ctx, frames, crashes)

    async def _handle_batch(self, ctx: ActorContext, frames: list[Frame]) -> None:
        with ctx.handling_requests():
            outcomes = await self._tokenize(ctx, frames)
        for frame, outcome in zip(frames, outcomes, strict=True):
            await self._finish(ctx, frame, outcome)

    async def _handle_apart(self, ctx: ActorContext, frames: list[Frame], crashes: int) -> None:
        """Retry the suspects one at a time: the first frame has ``crashes`` from its mark."""
        inbox = ctx.inbox[self.inbox]
        for i, frame in enumerate(frames):
            if i > 0:
                # It was in that batch (or joined since): one death with it in hand
                # already, so it is marked twice. A worker dying with it alone leaves 2.
                crashes = inbox.mark(frame)
                if crashes == 1:
                    crashes = inbox.mark(frame)
            # crashes - 1 workers died with it in hand: the first (its mark at 1) in a
            # batch, the others with it alone. Refused once max_crashes did, one at least
            # alone (so max_crashes 1 acts as 2: a death in a batch names nobody).
            outcome: Outcome
            if crashes - 1 >= max(self.max_crashes, 2):
                outcome = poison(frame, crashes - 1)
            else:
                with ctx.handling_requests():
                    (outcome,) = await self._tokenize(ctx, [frame])
            await self._finish(ctx, frame, outcome)

    async def _tokenize(self, ctx: ActorContext, frames: list[Frame]) -> list[Outcome]:
        """Decode the frames and tokenize them in one batch: the risky work."""
        outcomes: list[Outcome] = [None] * len(frames)
        reqs: dict[int, GenerateRequest] = {}
        for i, frame in enumerate(frames):
            try:
                req = codec.loads(frame.data)
                if not isinstance(req, GenerateRequest):
                    raise TypeError(f"expected a GenerateRequest, got {type(req).__name__}")
            except Exception as err:  # unreadable: refuse it, never crash on it
                outcomes[i] = unreadable(frame, err)
                continue
            await ctx.faults.point("tokenize", key=req.text if isinstance(req.text, str) else "")
            reqs[i] = req
        batch = list(reqs.values())
        texts = []
        for req in batch:  # in this thread: a chat template's render is time-limited here
            if req.messages is None:
                texts.append(self.core.text(req))
                continue
            ctx.progress()  # a render is a unit of work, bounded by render_limit_s
            texts.append(self.core.text(req))
            await trio.lowlevel.checkpoint()  # the heartbeat and aborts between renders
        if sum(_size(req) for req in batch) > THREAD_CHARS:
            # A long text takes the tokenizer seconds: off the trio thread, so that
            # aborts and heartbeats go on; the batch must still end within the
            # watchdog timeout (work on requests in hand counts from its start, or
            # from its last chat render's).
            results = await trio.to_thread.run_sync(self.core.encode, batch, texts)
        else:
            results = self.core.encode(batch, texts)
        for i, result in zip(reqs, results, strict=True):
            outcomes[i] = result
        return outcomes

    async def _finish(self, ctx: ActorContext, frame: Frame, outcome: Outcome) -> None:
        """Send what handling ``frame`` came to, then commit it: it is done."""
        if isinstance(outcome, Refused):
            await send(ctx.outbox[self.to_frontend], outcome)
        elif outcome is not None:
            scheduled, tokenized = outcome
            try:
                await send(ctx.outbox[self.to_scheduler], scheduled)
                await send(ctx.outbox[self.to_frontend], tokenized)
            except ResourceExhausted as err:  # /dev/shm stayed full: this frame's own input
                # may be what fills it (committed only after this): refused alone, not a crash
                refusal = refused_for_room(err)
                refused = Refused(tokenized.rid, type(refusal).__name__, str(refusal))
                await send(ctx.outbox[self.to_frontend], refused)
        ctx.inbox[self.inbox].commit(frame)

    async def _batch(self, inbox: Inbox) -> list[Frame]:
        frames = [await self._first(inbox)]
        self._drain(inbox, frames)
        if len(frames) > 1:  # a queue formed: worth waiting a little for more
            with trio.move_on_after(self.batch_wait_s):
                while len(frames) < self.max_batch:
                    add(frames, await self._first(inbox))
                    self._drain(inbox, frames)
        return frames

    async def _first(self, inbox: Inbox) -> Frame:
        tries = 0
        while True:
            try:
                return await inbox.receive()
            except (Broken, EndOfChannel):  # the frontend's end is restarting or closing
                await trio.sleep(RETRY_S)
            except SegmentError as err:  # a side frame's: no fd now, or lost (it is resent)
                tries = await unreadable_side(inbox.name, err, tries)

    def _drain(self, inbox: Inbox, frames: list[Frame]) -> None:
        while len(frames) < self.max_batch:
            try:
                add(frames, inbox.receive_nowait())
            except (WouldBlock, EndOfChannel):
                return
            except SegmentError as err:  # as in _first
                log.error("%s: a side frame cannot be read: %s", inbox.name, err)
                return


def add(frames: list[Frame], frame: Frame) -> None:
    """Append, unless it is the frame just received again (a fault plan's duplicate):
    handled once, it must not be marked again (as if a worker had died on it)."""
    if frame.offset != frames[-1].offset:
        frames.append(frame)


def rid_of(frame: Frame) -> str | None:
    """The rid a request frame names, read without building the request."""
    fields = codec.peek_fields(frame.data)
    return fields[1] if fields and len(fields) > 1 and isinstance(fields[1], str) else None


def _size(req: GenerateRequest) -> int:
    """Roughly how much the tokenizer has to read for ``req`` (each id is checked
    in Python: long id prompts go off the trio thread too)."""
    if isinstance(req.text, str):
        return len(req.text)
    if req.input_ids is not None:
        return len(req.input_ids)
    return sum(len(str(m.get("content", ""))) for m in req.messages or () if isinstance(m, dict))


def unreadable(frame: Frame, err: Exception) -> Refused | None:
    """A request frame that does not decode (the frontend checks each request
    before sending it, so only a corrupted frame gets here). Refused by its
    rid if that much can be read; else there is nobody to tell, and it is
    dropped with a log line rather than crash the tokenizer again and again."""
    rid = rid_of(frame)
    if rid is None:
        log.error("dropped an unreadable request frame at offset %d: %s", frame.offset, err)
        return None
    return refuse(rid, InvalidRequestError(f"request {rid} could not be read: {err}"))


def poison(frame: Frame, deaths: int) -> Refused | None:
    """The refusal of a frame that workers kept dying on, built without handling it."""
    rid = rid_of(frame)
    if rid is None:  # not MessagePack (a pickled request): decoding it is all there is
        try:
            req = codec.loads(frame.data)
        except Exception:
            req = None
        if not isinstance(req, GenerateRequest):
            log.error("dropped a poison frame at offset %d: no rid to refuse", frame.offset)
            return None
        rid = req.rid
    return refuse(
        rid,
        RequestFailedError(
            f"request {rid} was in hand when {deaths} tokenizer workers died, one at "
            "least with it alone; it fails alone so that the others can go on"
        ),
    )

"""The tokenizer worker actor: prompts from the frontend → ids for the scheduler.

Dynamic batching: after the first request arrives, every request already
queued joins its batch at once; only when a queue has formed (the batch holds
more than one) does the worker wait up to ``batch_wait_s`` for more, up to
``max_batch``. An idle worker adds no wait.

Each request's frame is marked before it is handled; a frame that
``max_crashes`` workers in a row died handling is a poison message: it is
refused alone (RequestFailedError) and the rest go on. A batch's frames are
committed once its results are in the scheduler's and the frontend's rings;
the scheduler and the frontend recognise a result sent twice by its rid.
"""

from __future__ import annotations

import logging

import trio

from rt.actors import Actor, ActorContext
from rt.actors.mailbox import Inbox
from rt.errors import Broken, EndOfChannel, InvalidRequestError, RequestFailedError, WouldBlock
from rt.messages import GenerateRequest, Refused
from rt.pipeline.mail import RETRY_S, send
from rt.shm import Frame, codec
from rt.tok.core import TokenizerCore, refuse
from rt.tok.load import load_tokenizer

log = logging.getLogger(__name__)


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

    async def startup(self, ctx: ActorContext) -> None:
        tokenizer = load_tokenizer(self.tokenizer_path)
        self.core = TokenizerCore(tokenizer, self.context_length, self.vocab_size)

    async def run(self, ctx: ActorContext) -> None:
        inbox = ctx.inbox[self.inbox]
        while True:
            frames = await self._batch(ctx)
            reqs: list[GenerateRequest] = []
            refused: list[Refused] = []
            for frame in frames:
                crashes = inbox.mark(frame)
                try:
                    req = codec.loads(frame.data)
                except Exception as err:  # unreadable: refuse it, never crash on it
                    refused += unreadable(frame, err)
                    continue
                if crashes > self.max_crashes:
                    refused.append(refuse(req.rid, poisoned(req.rid, self.max_crashes)))
                    continue
                await ctx.faults.point("tokenize", key=req.text or "")
                reqs.append(req)
            results = self.core.process(reqs) if reqs else []
            for result in results:
                if isinstance(result, Refused):
                    refused.append(result)
                    continue
                scheduled, tokenized = result
                await send(ctx.outbox[self.to_scheduler], scheduled)
                await send(ctx.outbox[self.to_frontend], tokenized)
            for msg in refused:
                await send(ctx.outbox[self.to_frontend], msg)
            inbox.commit(frames[-1])

    async def _batch(self, ctx: ActorContext) -> list[Frame]:
        inbox = ctx.inbox[self.inbox]
        frames = [await self._first(inbox)]
        self._drain(inbox, frames)
        if len(frames) > 1:  # a queue formed: worth waiting a little for more
            with trio.move_on_after(self.batch_wait_s):
                while len(frames) < self.max_batch:
                    frames.append(await self._first(inbox))
                    self._drain(inbox, frames)
        return frames

    async def _first(self, inbox: Inbox) -> Frame:
        while True:
            try:
                return await inbox.receive()
            except (Broken, EndOfChannel):  # the frontend's end is restarting or closing
                await trio.sleep(RETRY_S)

    def _drain(self, inbox: Inbox, frames: list[Frame]) -> None:
        while len(frames) < self.max_batch:
            try:
                frames.append(inbox.receive_nowait())
            except (WouldBlock, EndOfChannel):
                return


def unreadable(frame: Frame, err: Exception) -> list[Refused]:
    """A request frame that does not decode (the frontend checks each request
    before sending it, so only a corrupted frame gets here). Refused by its
    rid if that much can be read; else there is nobody to tell, and it is
    dropped with a log line rather than crash the tokenizer again and again."""
    fields = codec.peek_fields(frame.data)
    rid = fields[1] if fields and len(fields) > 1 and isinstance(fields[1], str) else None
    if rid is None:
        log.error("dropped an unreadable request frame at offset %d: %s", frame.offset, err)
        return []
    return [refuse(rid, InvalidRequestError(f"request {rid} could not be read: {err}"))]


def poisoned(rid: str, crashes: int) -> RequestFailedError:
    return RequestFailedError(
        f"request {rid} was in flight in the tokenizer for {crashes} crashes in a row; "
        "it fails alone so that the others can go on"
    )

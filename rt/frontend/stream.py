"""A request's stream: its chunks as they come, read from the frontend's table.

A reader that fell behind gets what is waiting for one sequence as one chunk;
closing the stream early (``async with``, ``aclose()``, or dropping it), or
cancelling the task that iterates, aborts the request (:meth:`Engine._leave`)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np
import trio

from rt import errors
from rt.frontend.requests import prompt_ids, record_meta
from rt.frontend.table import Update
from rt.messages import GenerateRequest, Refused
from rt.outputs import Chunk, Meta

if TYPE_CHECKING:
    from rt.frontend.engine import Engine


class Stream:
    """The chunks of one request, as an async iterator, and an async context
    manager that closes it (a class, not an async generator: the abort that
    closing triggers is synchronous, and a stream dropped unfinished is aborted
    when it is collected: at once for ``async for c in engine.stream(...)``)."""

    def __init__(self, engine: Engine, req: GenerateRequest, user_rid: str) -> None:
        self._token = trio.lowlevel.current_trio_token()  # first: __del__ needs it
        self._engine = engine
        self._req = req
        self.rid = user_rid
        self._updates: trio.MemoryReceiveChannel[Update | Refused] | None = None
        self._done = False
        self.cut = False  # closed before the engine had ended it (aborted, or never sent)
        # counts and timings as of the last chunk (final with the last sequence's end)
        self.meta: Meta | None = None
        self.input_ids: np.ndarray | None = None  # the prompt's, as the model reads them
        self._prompt_logprobs_sent = False
        self._next: Update | Refused | None = None  # received while coalescing, not yet given
        self._reading = False  # a task is in __anext__ (one at a time, as trio's channels)
        # the engine is held from submission until the stream is closed (its end read,
        # left, or collected): a drain then waits for a reader still handling the
        # last chunk, whose request is no longer live
        self._hold = contextlib.ExitStack()
        self._submitted = trio.Event()  # sent to the engine (or closed before)
        # work accepted before a drain began (an HTTP request's later prompts): a drain,
        # which refuses new requests, takes it till it gives up (a stream of the Python
        # API is a new request when first read: one made before the drain and read
        # after, taken, held the drain its whole timeout behind a backlog of them)
        self.accepted = False

    def __aiter__(self) -> Stream:
        return self

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def __anext__(self) -> Chunk:
        self._engine._check_run()  # read from another run, its wake-ups killed the engine's
        if self._done:
            raise StopAsyncIteration
        if self._reading:
            raise trio.BusyResourceError("another task is already reading this stream")
        self._reading = True
        try:
            return await self._read()
        finally:
            self._reading = False

    async def _read(self) -> Chunk:
        try:
            if self._updates is None:
                self._hold.enter_context(self._engine.hold())
                self._updates = await self._engine._submit(self._req, self.rid, self.accepted)
                self._submitted.set()
                if self._done:  # closed by another task while it was being submitted
                    self._engine._leave(self._req.rid)
                    raise StopAsyncIteration
            item = self._next
            self._next = None
            if item is None:
                try:
                    item = await self._updates.receive()
                except trio.EndOfChannel:
                    raise StopAsyncIteration from None
            if isinstance(item, Refused):
                raise refusal_error(item)
        except BaseException:
            self.close()
            raise
        item = self._coalesce(item)
        record = self._engine.table.records.get(self._req.rid)
        if record is None:  # closed by another task since
            raise StopAsyncIteration
        seq = record.seqs[item.index]
        self.meta = record_meta(record)
        self.input_ids = record.input_ids
        sampling, end = record.req.sampling, item.offset + len(item.ids)
        logprobs = tuple(seq.logprobs[item.offset : end]) if sampling.logprobs else None
        top = (
            tuple(
                tuple((int(i), float(lp)) for i, lp in t)
                for t in seq.top_logprobs[item.offset : end]
            )
            if sampling.top_logprobs
            else None
        )
        ids = prompt = prompt_top = None
        if record.prompt_logprobs is not None and not self._prompt_logprobs_sent:
            self._prompt_logprobs_sent = True
            ids, prompt, prompt_top = (
                prompt_ids(record),
                record.prompt_logprobs,
                record.prompt_top_logprobs,
            )
        if (
            record.finished
            and self._next is None
            and self._updates.statistics().current_buffer_used == 0
        ):
            # the last chunk: its rid is free for a new request at once, though the
            # stream holds the engine until it is closed (its reader may still be at work)
            self._engine._leave(self._req.rid)
        return Chunk(
            self.rid,
            item.index,
            item.text,
            tuple(item.ids),
            seq.finish_reason if item.finished else None,
            seq.matched_stop if item.finished else None,
            item.stepped_at,
            logprobs,
            top,
            ids,
            prompt,
            prompt_top,
        )

    def _coalesce(self, item: Update) -> Update:
        """``item`` and the updates of the same sequence already waiting behind it,
        as one: a reader that fell behind gets one chunk for several steps (an
        HTTP stream then sends one event for them, not one each). The chunk's
        ``stepped_at`` is its oldest tokens'."""
        assert self._updates is not None
        while not item.finished:
            try:
                follow = self._updates.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            if not isinstance(follow, Update) or follow.index != item.index:
                self._next = follow
                break
            item = Update(
                item.rid,
                item.index,
                item.ids + follow.ids,
                item.text + follow.text,
                follow.finished,
                item.stepped_at or follow.stepped_at,
                item.offset,
            )
        return item

    @property
    def ended(self) -> bool:
        """The engine has ended the request (made its last token, or failed it),
        whether or not its chunks have been read; or the stream is closed."""
        if self._done:
            return True
        if self._updates is None:  # not submitted yet
            return False
        record = self._engine.table.records.get(self._req.rid)
        return record is None or record.finished

    async def tokenized(self) -> bool:
        """Wait until the engine has taken the prompt: tokenized, within the context
        (True); False if the request ended without (refused, aborted, closed). The
        request is sent by the task that reads the stream: this waits for that too."""
        await self._submitted.wait()
        if self._updates is None:  # closed before it was sent
            return False
        return await self._engine._tokenized(self._req.rid)

    def close(self) -> None:
        """Stop: abort the request if it has not finished. A stream closed before
        its first chunk takes its counts (its prompt's tokens) and ids from the table."""
        self._submitted.set()  # (a task waiting in tokenized() sees it closed)
        if not self._done:
            self.cut = not self.ended
            self._done = True
            if self._updates is not None:
                record = self._engine.table.records.get(self._req.rid)
                if self.meta is None and record is not None:
                    self.meta, self.input_ids = record_meta(record), record.input_ids
                self._engine._leave(self._req.rid)
        self._hold.close()

    async def aclose(self) -> None:
        self._engine._check_run()  # from another run, it hung the engine's controls for good
        self.close()
        await trio.lowlevel.checkpoint()

    def __del__(self) -> None:
        # The collector may run this in any thread, or inside trio's own work: the
        # abort is handed to the engine's trio thread (closing here, from a worker
        # thread, once left the engine's control sender asleep for good).
        if not getattr(self, "_done", True):  # (not when __init__ failed)
            record = self._engine.table.records.get(self._req.rid)
            if record is not None:  # (its rid is free at once: the abort follows)
                record.dropped = True
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self.close)


def refusal_error(refused: Refused) -> errors.RtError:
    cls = getattr(errors, refused.error, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.RtError)):
        cls = errors.RequestError
    return cls(refused.message)

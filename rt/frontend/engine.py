"""The engine: the supervised pipeline behind ``rt.open_engine``.

The frontend lives in the caller's trio loop. It owns the request table (the
source of truth), sends each request to a tokenizer worker, routes what comes
back to the waiting caller, and recovers what a restarted actor lost:

* scheduler restarted: requests stuck across ``max_crashes_per_request``
  crashes fail alone; every other live request is resubmitted as prompt +
  tokens so far;
* detokenizer restarted: whatever its predecessor sent is taken first, then
  every live stream is reopened with the output the table holds;
* tokenizer restarted: nothing to do, its ring redelivers what it had not
  committed.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from rt import errors
from rt.actors import ActorState, ActorStatus, Supervisor, open_supervisor
from rt.actors.faultplan import FaultPlan
from rt.config import EngineOptions
from rt.frontend.requests import build_request, finished_output
from rt.frontend.table import Record, RequestTable, Update
from rt.frontend.wiring import DETOKENIZER, SCHEDULER, supervisor_spec
from rt.messages import (
    Abort,
    CloseStream,
    FinishNow,
    GenerateRequest,
    Refused,
    SchedulerStats,
    StreamDeltas,
    Tokenized,
    stream_key,
)
from rt.outputs import Chunk, GenerateOutput
from rt.shm import RingReceiver, RingSender, codec

log = logging.getLogger(__name__)
RETRY_S = 0.02  # how often a frontend end retries a ring whose peer is restarting


class Engine:
    """Use through :func:`open_engine`."""

    def __init__(self, options: EngineOptions, supervisor: Supervisor, vocab_size: int) -> None:
        self.options = options
        self.vocab_size = vocab_size
        self.table = RequestTable(options.max_crashes_per_request)
        self._sup = supervisor
        workers = options.tokenizer_workers
        self._to_tok = [
            RingSender.attach(supervisor.ring(f"front-tok{i}").spec) for i in range(workers)
        ]
        self._from_tok = [
            RingReceiver.attach(supervisor.ring(f"tok{i}-front").spec) for i in range(workers)
        ]
        self._to_sched = RingSender.attach(supervisor.ring("front-sched").spec)
        self._to_detok = RingSender.attach(supervisor.ring("front-detok").spec)
        self._from_detok = RingReceiver.attach(supervisor.ring("detok-front").spec)
        self._control_send, self._control_recv = trio.open_memory_channel[tuple[RingSender, Any]](
            math.inf
        )
        self._waiters: dict[str, trio.MemorySendChannel[Update | Refused]] = {}
        self._round_robin = itertools.count()
        self._closing = False
        self._scheduler_epoch = 0  # scheduler restarts seen
        self._stats: SchedulerStats | None = None
        self._stats_changed = trio.Event()

    # ---- the public API -------------------------------------------------------

    async def generate(self, prompt: Any = None, **options: Any) -> GenerateOutput:
        """Generate to the end. ``prompt`` is text, token ids or chat messages;
        ``options`` are sampling parameters, ``stop``, ``n``, ``logprobs``, ….
        Cancelling the awaiting task aborts the request."""
        req = build_request(prompt, options, self.vocab_size)
        updates = await self._submit(req)
        try:
            async for item in updates:
                if isinstance(item, Refused):
                    raise refusal_error(item)
            return finished_output(self.table.records[req.rid])
        finally:
            self._leave(req.rid)

    def stream(self, prompt: Any = None, **options: Any) -> Stream:
        """``async for chunk in engine.stream(...)``: the text and ids of each sequence
        as they come (deltas). Leaving the loop early, or cancelling the task that
        iterates, aborts the request."""
        return Stream(self, build_request(prompt, options, self.vocab_size))

    def actors(self) -> tuple[ActorStatus, ...]:
        """Every child: name, pid, state, restart count, last exit reason, heartbeat age."""
        return self._sup.status().actors

    @property
    def supervisor(self) -> Supervisor:
        return self._sup

    async def scheduler_stats(
        self, until: Callable[[SchedulerStats], bool] = lambda s: True
    ) -> SchedulerStats:
        """The scheduler's state when it last went idle; waits for one that ``until`` accepts."""
        while self._stats is None or not until(self._stats):
            await self._stats_changed.wait()
        return self._stats

    # ---- requests in and out ----------------------------------------------------

    async def _submit(self, req: GenerateRequest) -> trio.MemoryReceiveChannel[Update | Refused]:
        if self._closing:
            raise errors.EngineShutdownError("the engine is shutting down; no new requests")
        await self._wait_healthy()
        self.table.add(req).epoch = self._scheduler_epoch
        send, receive = trio.open_memory_channel[Update | Refused](math.inf)
        self._waiters[req.rid] = send
        worker = next(self._round_robin) % len(self._to_tok)
        try:
            await self._send(self._to_tok[worker], req)
        except BaseException:  # cancelled while the ring was full: the request never left
            self.table.remove(req.rid)
            self._waiters.pop(req.rid, None)
            raise
        return receive

    async def _wait_healthy(self) -> None:
        """A new request waits while an actor restarts, at most ``restart_wait_timeout``."""
        if self._sup.status().healthy:
            return
        timeout = self.options.restart_wait_timeout
        with trio.move_on_after(timeout):
            await self._sup.wait_for(lambda status: status.healthy)
            return
        down = [a.name for a in self._sup.status().actors if a.state is not ActorState.RUNNING]
        raise errors.ServiceUnavailableError(
            f"{', '.join(down) or 'an actor'} did not come back within {timeout:g} s "
            "(restart_wait_timeout); try again later"
        )

    def _leave(self, rid: str) -> None:
        """The caller is done with ``rid``: it leaves the table, and if it had not
        finished (cancellation, an error, an abandoned stream) it is aborted."""
        record = self.table.remove(rid)
        self._waiters.pop(rid, None)
        if record is not None and not record.finished and not self._closing:
            self._queue(self._to_sched, Abort(rid))
            self._close_streams(record)

    def _deliver(self, record: Record, item: Update | Refused) -> None:
        waiter = self._waiters.get(record.rid)
        if waiter is not None:
            waiter.send_nowait(item)
            if record.finished:
                waiter.close()

    def _finish(self, record: Record) -> None:
        self._close_streams(record)
        if any(isinstance(s.matched_stop, str) for s in record.seqs):
            self._queue(self._to_sched, FinishNow(record.rid))  # a stop string: free its KV now

    def _close_streams(self, record: Record) -> None:
        for i in range(len(record.seqs)):
            self._queue(self._to_detok, CloseStream(stream_key(record.rid, i)))

    def _fail(self, refused: Refused) -> None:
        record = self.table.on_refused(refused)
        if record is not None and record.error is refused:
            self._close_streams(record)
            self._deliver(record, refused)

    # ---- routing (tasks in the engine's nursery) --------------------------------

    async def route_tokenized(self, rx: RingReceiver) -> None:
        async for msg in self._frames(rx):
            if isinstance(msg, Tokenized):
                record = self.table.on_tokenized(msg)
                if record is not None:
                    for op in self.table.open_streams(record):
                        self._queue(self._to_detok, op)
                    if record.epoch != self._scheduler_epoch:
                        # The scheduler restarted after it may have taken this request in
                        # (from the tokenizer's ring) but before these ids reached the table,
                        # so the restart could not resubmit it: do it now (a duplicate is
                        # recognised by rid).
                        self._resubmit(record)
            elif isinstance(msg, Refused):
                self._fail(msg)

    async def route_deltas(self) -> None:
        async for msg in self._frames(self._from_detok):
            self._on_deltas(msg)

    def _on_deltas(self, msg: StreamDeltas) -> None:
        for delta in msg.deltas:
            update = self.table.on_delta(delta, msg.stepped_at)
            if update is None:
                continue
            record = self.table.records[delta.rid]
            self._deliver(record, update)
            if record.finished:
                self._finish(record)
        for refused in msg.refused:
            self._fail(refused)
        if msg.stats is not None:
            self._stats = msg.stats
            self._stats_changed.set()
            self._stats_changed = trio.Event()

    async def _frames(self, rx: RingReceiver) -> AsyncIterator[Any]:
        """Each message of ``rx``, committed once handled; waits out a restarting peer."""
        while True:
            try:
                data = await rx.receive_data()
            except (errors.Broken, errors.EndOfChannel):  # the sender is restarting
                await trio.sleep(RETRY_S)
                continue
            yield codec.loads(data)
            rx.commit()

    def _queue(self, tx: RingSender, msg: Any) -> None:
        self._control_send.send_nowait((tx, msg))

    async def send_control(self) -> None:
        async for tx, msg in self._control_recv:
            await self._send(tx, msg)

    async def _send(self, tx: RingSender, msg: Any) -> None:
        data = codec.dumps(msg)
        while True:
            try:
                await tx.send(data)
                return
            except errors.Broken:  # the reader died with the ring full: wait for its successor
                await trio.sleep(RETRY_S)

    # ---- recovery ------------------------------------------------------------------

    async def watch_restarts(self) -> None:
        seen = {a.name: a.incarnation for a in self._sup.status().actors}

        def restarted(status: Any) -> bool:
            return any(
                a.state is ActorState.RUNNING and a.incarnation > seen[a.name]
                for a in status.actors
            )

        while True:
            status = await self._sup.wait_for(restarted)
            for actor in status.actors:
                if actor.state is ActorState.RUNNING and actor.incarnation > seen[actor.name]:
                    seen[actor.name] = actor.incarnation
                    log.warning("%s restarted (incarnation %d)", actor.name, actor.incarnation)
                    self._recover(actor.name)

    def _recover(self, name: str) -> None:
        if name == SCHEDULER:
            for record in self.table.note_scheduler_crash():
                self._fail(
                    Refused(
                        record.rid,
                        "RequestFailedError",
                        f"request {record.rid} was in flight for {self.table.max_crashes} "
                        "scheduler crashes in a row; it fails alone so that the others go on",
                    )
                )
            self._scheduler_epoch += 1
            for record in self.table.live():
                self._resubmit(record)
        elif name == DETOKENIZER:
            self._drain(self._from_detok, self._on_deltas)
            for record in self.table.live():
                if record.input_ids is not None:
                    for op in self.table.open_streams(record):
                        self._queue(self._to_detok, op)

    def _resubmit(self, record: Record) -> None:
        sub = self.table.resubmission(record)
        if sub is not None:  # else its ids are unknown: their arrival will resubmit it
            record.epoch = self._scheduler_epoch
            self._queue(self._to_sched, sub)

    @staticmethod
    def _drain(rx: RingReceiver, handle: Callable[[Any], None]) -> None:
        """Handle every frame already in ``rx``: a dead sender's last words."""
        while True:
            try:
                data = rx.receive_data_nowait()
            except (errors.WouldBlock, errors.EndOfChannel):
                return
            handle(codec.loads(data))
            rx.commit()

    # ---- shutdown -------------------------------------------------------------------

    def close(self) -> None:
        self._closing = True
        for rid, waiter in list(self._waiters.items()):
            record = self.table.records.get(rid)
            if record is not None and not record.finished:
                waiter.send_nowait(
                    Refused(
                        rid,
                        "EngineShutdownError",
                        "the engine shut down before the request finished",
                    )
                )
            waiter.close()
        for end in (
            *self._to_tok,
            *self._from_tok,
            self._to_sched,
            self._to_detok,
            self._from_detok,
        ):
            end.close()


class Stream:
    """The chunks of one request, as an async iterator (a class, not an async
    generator: leaving it early then needs no ``aclosing``, and the abort it
    triggers is synchronous)."""

    def __init__(self, engine: Engine, req: GenerateRequest) -> None:
        self._engine = engine
        self._req = req
        self._updates: trio.MemoryReceiveChannel[Update | Refused] | None = None
        self._done = False

    @property
    def rid(self) -> str:
        return self._req.rid

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Chunk:
        if self._done:
            raise StopAsyncIteration
        try:
            if self._updates is None:
                self._updates = await self._engine._submit(self._req)
            try:
                item = await self._updates.receive()
            except trio.EndOfChannel:
                raise StopAsyncIteration from None
            if isinstance(item, Refused):
                raise refusal_error(item)
        except BaseException:
            self.close()
            raise
        seq = self._engine.table.records[self.rid].seqs[item.index]
        return Chunk(
            self.rid,
            item.index,
            item.text,
            tuple(item.ids),
            seq.finish_reason if item.finished else None,
            seq.matched_stop if item.finished else None,
            item.stepped_at,
        )

    def close(self) -> None:
        """Stop: abort the request if it has not finished."""
        if not self._done:
            self._done = True
            if self._updates is not None:
                self._engine._leave(self.rid)

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def __del__(self) -> None:
        self.close()


def refusal_error(refused: Refused) -> errors.RtError:
    cls = getattr(errors, refused.error, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.RtError)):
        cls = errors.RequestError
    return cls(refused.message)


@asynccontextmanager
async def open_engine(model_path: str | None = None, **options: Any) -> AsyncIterator[Engine]:
    """Start the engine (tokenizer, scheduler and detokenizer processes, supervised)
    for the body of the ``async with``. ``model_path=None`` serves the shipped default
    model; ``options`` are those of :class:`rt.config.EngineOptions`."""
    opts = EngineOptions.build(model_path=model_path, **options)
    spec = supervisor_spec(opts)
    plan = opts.fault_plan
    if isinstance(plan, str):
        plan = FaultPlan.load(plan)
    _, vocab_size = opts.model_limits()
    async with open_supervisor(spec, fault_plan=plan) as supervisor:
        engine = Engine(opts, supervisor, vocab_size)
        try:
            async with trio.open_nursery() as nursery:
                for rx in engine._from_tok:
                    nursery.start_soon(engine.route_tokenized, rx)
                nursery.start_soon(engine.route_deltas)
                nursery.start_soon(engine.send_control)
                nursery.start_soon(engine.watch_restarts)
                try:
                    yield engine
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            engine.close()  # after the routing tasks are gone: they use the rings

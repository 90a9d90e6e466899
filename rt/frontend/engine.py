"""The engine: the supervised pipeline behind ``rt.open_engine``.

The frontend lives in the caller's trio loop. It owns the request table (the
source of truth), sends each request to a tokenizer worker, routes what comes
back to the waiting caller, and recovers what a restarted actor lost:

* scheduler restarted (a new epoch): every request in flight is resubmitted as
  prompt + tokens so far; after a repeat crash in a step the suspects are
  isolated by halving while new requests wait, and one that crashes the
  scheduler alone fails as poison (rt/frontend/table.py); every live stream is
  reopened at the new epoch with the output the table holds;
* detokenizer restarted: its first frame (``DetokenizerUp``) follows whatever
  its predecessor sent, so the one task that reads that ring handles those
  frames first and then reopens every live stream (one ordered path);
* tokenizer restarted: nothing to do (its ring redelivers what it had not committed);
* a frame of a request's output lost (a gap, seen by the table or reported by
  the detokenizer): that request alone is resumed from what the table holds,
  at its next attempt, and its streams reopened there.

Every ring the frontend writes has one lock in front of it, so any number of
callers wait their turn on a full ring (backpressure) instead of colliding
(rt/frontend/plumbing.py: how it sends and reads without a checkpoint per
message). A request's rid on the rings is the frontend's own (unique); the
caller's rid may be reused once its request has finished.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import trio

from rt import errors
from rt.actors import ActorState, ActorStatus, Supervisor
from rt.config import EngineOptions
from rt.frontend.plumbing import Controls, Latest, Out, frames
from rt.frontend.requests import build_request, finished_output
from rt.frontend.stream import Stream, refusal_error
from rt.frontend.table import OutputGap, Record, RequestTable, Update
from rt.frontend.tokenizer_queues import TokenizerQueues
from rt.frontend.wiring import SCHEDULER, can_serve
from rt.messages import (
    BUSY_REPORT_EVERY_S,
    Abort,
    CloseStream,
    Control,
    DetokenizerUp,
    DetokStats,
    FinishNow,
    GenerateRequest,
    Refused,
    SchedulerStats,
    StreamDeltas,
    Tokenized,
    stream_key,
)
from rt.outputs import GenerateOutput
from rt.shm import RingReceiver, RingSender

log = logging.getLogger(__name__)
# A request in the queue of a scheduler at work (it stepped lately, and reports once a
# second while busy) is not sent again for want of news (65,536 prompts of one batch
# had 25,000 sent again) for so many stall timeouts: one lost under a queue that never
# empties (steady overload) hung till the load stopped
QUEUE_PATIENCE = 4
SHUTTING_DOWN = "the engine is shutting down; no new requests"
STALLED = "%d request(s) with no news for %.1f s or more; sending them again: %s%s"


class Engine:
    """Use through :func:`open_engine`."""

    def __init__(self, options: EngineOptions, supervisor: Supervisor) -> None:
        self.options = options
        self.context_length, self.vocab_size = options.model_limits()
        self.sampling_defaults = options.model_sampling_defaults()
        self.table = RequestTable(options.max_crashes_per_request)
        self._sup = supervisor
        workers = options.tokenizer_workers

        def out(name: str) -> Out:
            return Out(RingSender.attach(supervisor.ring(name).spec))

        def in_(name: str) -> RingReceiver:
            return RingReceiver.attach(supervisor.ring(name).spec)

        self._to_tok = [out(f"front-tok{i}") for i in range(workers)]
        self._from_tok = [in_(f"tok{i}-front") for i in range(workers)]
        self._to_sched = out("front-sched")
        self._to_detok = out("front-detok")
        self._from_detok = in_("detok-front")
        self.controls = Controls()  # what the sync code sends
        self._waiters: dict[str, trio.MemorySendChannel[Update | Refused]] = {}
        self._tokenizing: dict[str, trio.Event] = {}  # set when that rid's ids come, or it ends
        self._closing = False  # the rings are closing: nothing more is sent
        self.refusing = False  # a drain: new requests are refused, the rest goes on
        self.gave_up = False  # the drain gave up (refuse_live): accepted work is refused too
        self._holds = 0  # callers answering for requests that left the table (hold())
        scheduler = supervisor.status().actor(SCHEDULER)
        self._epoch, self._charged = scheduler.incarnation, scheduler.request_crashes
        self._stats: Latest[SchedulerStats] = Latest()
        self._detok_stats: Latest[DetokStats] = Latest()
        self._quarantine_changed = trio.Event()
        self._control_seq = itertools.count(1)
        self._paused = False  # generation paused by the operator: told to every scheduler
        self._tok_queues = TokenizerQueues(workers)  # who waits for ids behind whom
        self.stopped_by: str | None = None  # the signal that stopped the engine, if one did
        self._token = trio.lowlevel.current_trio_token()  # the trio run it lives in
        # the caller's rids of requests waiting to be sent (an actor restarting, or
        # suspects of a crash being told apart), each wait's scope: abort() cancels it
        self._arriving: dict[str, list[trio.CancelScope]] = {}

    # ---- the public API -------------------------------------------------------

    async def generate(self, prompt: Any = None, **options: Any) -> GenerateOutput:
        """Generate to the end. ``prompt`` is text, token ids or chat messages;
        ``options`` are sampling parameters, ``stop``, ``n``, ``logprobs``, ….
        Cancelling the awaiting task aborts the request."""
        req, user_rid = self._build(prompt, options)
        with self.hold():  # till the caller has its answer (a finished record is not live)
            updates = await self._submit(req, user_rid)
            try:
                async for item in updates:
                    if isinstance(item, Refused):
                        raise refusal_error(item)
                return finished_output(self.table.records[req.rid])
            finally:
                self._leave(req.rid)

    def stream(self, prompt: Any = None, **options: Any) -> Stream:
        """``async for chunk in engine.stream(...)``: each sequence's text and ids as
        they come (deltas). Cancelling the iterating task aborts the request, and so does
        leaving the loop early, once the stream is closed: at once if the loop held the
        only reference; else by ``async with engine.stream(...) as stream:``, ``await
        stream.aclose()``, or when it is collected (a drain waits for it until then)."""
        return Stream(self, *self._build(prompt, options))

    def abort(self, rid: str) -> bool:
        """Abort the request in flight under the caller's ``rid`` (``stream.rid``, or the
        ``rid`` option): its KV is freed, its reader raises RequestAborted (what came before
        read as usual); one waiting to be sent (an actor restarting) is not sent. False,
        doing nothing, when no unfinished request has it (a stream not read sent nothing)."""
        self._check_run()
        if not isinstance(rid, str):  # (a list raised TypeError: unhashable)
            raise errors.InvalidRequestError(f"rid: expected a string, got {type(rid).__name__}")
        waiting = [s for s in self._arriving.get(rid, ()) if not s.cancel_called]
        for scope in waiting:
            scope.cancel()
        record = self.table.records.get(self.table.by_user_rid.get(rid, ""))
        if record is None or record.finished:
            return bool(waiting)
        self._fail(Refused(record.rid, "RequestAborted", f"rid {rid!r}: aborted by abort()"))
        self._queue(self._to_sched, Abort(record.rid))  # (a tombstone, if it is not there yet)
        return True

    @property
    def rids(self) -> set[str]:
        """The caller's rids of the requests in flight, sent or waiting to be."""
        return {r.user_rid for r in self.table.live()} | self._arriving.keys()

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
        return await self._stats.wait(until)

    async def detokenizer_stats(
        self, until: Callable[[DetokStats], bool] = lambda s: True
    ) -> DetokStats:
        """What the detokenizer held at its last report; waits for one ``until`` accepts."""
        return await self._detok_stats.wait(until)

    # ---- the operator's controls ----------------------------------------------------

    async def flush_cache(self) -> bool:
        """Drop every cached prefix. Returns False, having done nothing, while a request
        holds KV (as SGLang's ``/flush_cache``; one waiting to start holds none)."""
        return await self._control("flush_cache")

    async def pause_generation(self, retract: bool = False) -> None:
        """Stop running model steps; returns once none runs. Requests in flight wait,
        their KV kept (``retract``: given back, computed again after the continue); new
        ones are accepted and wait too; a cancel still frees KV. A restart stays paused."""
        self._paused = True
        await self._control("retract" if retract else "pause")

    async def continue_generation(self) -> None:
        """Resume after :meth:`pause_generation` (a no-op when not paused)."""
        self._paused = False
        now = time.monotonic()
        for record in self.table.live():  # no news was due while paused
            record.progress_at = max(record.progress_at, now)
        await self._control("continue")

    @property
    def paused(self) -> bool:
        return self._paused

    async def _control(self, op: str) -> bool:
        """Send ``op`` to the scheduler and return its answer once it applied it;
        sent again to a successor when the scheduler restarts first (a pause or a
        continue as the state is then: of two calls, the later must win)."""
        self._check_run()
        while True:
            if self._closing:
                raise errors.EngineShutdownError("the engine is shut down")
            seq, epoch = next(self._control_seq), self._epoch
            if op in ("pause", "retract", "continue"):  # as the state is now: the later wins
                op = ("retract" if op == "retract" else "pause") if self._paused else "continue"
            self._queue(self._to_sched, Control(op, seq))
            stats = await self._stats.wait(functools.partial(self._answered, seq, epoch))
            if stats.control >= seq:
                return stats.control_ok

    def _answered(self, seq: int, epoch: int, stats: SchedulerStats) -> bool:
        """Whether command ``seq`` was applied, or its scheduler (``epoch``) is gone."""
        return stats.control >= seq or self._epoch != epoch

    # ---- requests in and out ----------------------------------------------------

    def _check_run(self) -> None:
        """Refuse a caller in another trio run (a thread's own ``trio.run``): its
        tasks cannot be woken from this one (it killed the engine's run)."""
        if trio.lowlevel.current_trio_token() is not self._token:
            raise RuntimeError(
                "this engine lives in another trio run: call it from that run (from a "
                "thread, through trio.from_thread.run)"
            )

    def _build(self, prompt: Any, options: dict[str, Any]) -> tuple[GenerateRequest, str]:
        """The request with a ring rid of its own, and the caller's rid; the sampling
        parameters it leaves out (or gives as None) take the model's defaults."""
        self._check_run()
        for key, value in self.sampling_defaults.items():
            if options.get(key) is None:
                options = {**options, key: value}
        limits = self.vocab_size, self.context_length, self.options.schedule_policy
        req = build_request(prompt, options, *limits, self.options.max_logprobs)
        return msgspec.structs.replace(req, rid=uuid.uuid4().hex), req.rid

    async def _submit(
        self, req: GenerateRequest, user_rid: str, accepted: bool = False
    ) -> trio.MemoryReceiveChannel[Update | Refused]:
        if self._closing or self.gave_up or (self.refusing and not accepted):
            raise errors.EngineShutdownError(SHUTTING_DOWN)
        waiting = trio.CancelScope()  # abort() or close() cancels it: the request is not sent
        self._arriving.setdefault(user_rid, []).append(waiting)
        try:
            with waiting:
                await self._wait_healthy()
                while self.table.isolating:  # suspects of a crash are being told apart
                    await self._quarantine_changed.wait()
        finally:
            self._arriving[user_rid].remove(waiting)
            if not self._arriving[user_rid]:
                del self._arriving[user_rid]
        if self._closing:
            raise errors.EngineShutdownError(SHUTTING_DOWN)
        if waiting.cancel_called:
            raise errors.RequestAborted(f"rid {user_rid!r}: aborted by abort()")
        self.table.add(req, user_rid, self._epoch)
        send, receive = trio.open_memory_channel[Update | Refused](math.inf)
        self._waiters[req.rid] = send
        try:
            await self._to_tokenizer(req)
        except BaseException as err:  # cancelled waiting for the ring: the request never left
            self.table.remove(req.rid)
            self._waiters.pop(req.rid, None)
            if self._closing and isinstance(err, errors.Closed):  # (the ring closed under it)
                raise errors.EngineShutdownError(SHUTTING_DOWN) from None
            raise
        return receive

    async def _wait_healthy(self) -> None:
        """A new request waits while the scheduler, the detokenizer or every tokenizer
        worker restarts or is silent (see can_serve), at most ``restart_wait_timeout``."""
        timeout, workers = self.options.restart_wait_timeout, len(self._to_tok)
        with trio.move_on_after(timeout):
            while not can_serve(self._sup.status(), workers):  # (silence is no news: polled)
                with trio.move_on_after(0.5):
                    await self._sup.wait_for(lambda status: can_serve(status, workers))
            return
        down = [a.name for a in self._sup.status().actors if a.state is not ActorState.RUNNING]
        raise errors.ServiceUnavailableError(
            f"{', '.join(down) or 'an actor'} did not come back within {timeout:g} s "
            "(restart_wait_timeout); try again later"
        )

    async def _tokenized(self, rid: str) -> bool:
        """Wait until the request ``rid`` has its prompt's ids (the tokenizer took it,
        within the context: True), or it ended without them (refused, aborted: False)."""
        while True:
            record = self.table.records.get(rid)
            if record is not None and record.input_ids is not None and record.error is None:
                return True
            if record is None or record.finished:
                return False
            await self._tokenizing.setdefault(rid, trio.Event()).wait()

    def _wake_tokenized(self, rid: str) -> None:
        if (event := self._tokenizing.pop(rid, None)) is not None:
            event.set()

    def _leave(self, rid: str) -> None:
        """The caller is done with ``rid``: it leaves the table, aborted if unfinished."""
        self._wake_tokenized(rid)
        record = self.table.remove(rid)
        waiter = self._waiters.pop(rid, None)
        if waiter is not None:
            waiter.close()  # a reader in another task sees the end instead of waiting for ever
        self._tok_queues.forget(rid)
        if record is not None and not record.finished and not self._closing:
            self._queue(self._to_sched, Abort(rid))
            self._close_streams(record)
        self._readmit()

    def _deliver(self, record: Record, item: Update | Refused) -> None:
        if (waiter := self._waiters.get(record.rid)) is not None:
            waiter.send_nowait(item)
            if record.finished:
                waiter.close()

    def _finish(self, record: Record) -> None:
        self._close_streams(record)
        if any(isinstance(s.matched_stop, str) for s in record.seqs):
            self._queue(self._to_sched, FinishNow(record.rid))  # a stop string: free its KV now
        self._readmit()

    def _close_streams(self, record: Record) -> None:
        for i in range(len(record.seqs)):
            self._queue(self._to_detok, CloseStream(stream_key(record.rid, i)))

    def _fail(self, refused: Refused) -> None:
        self._wake_tokenized(refused.rid)
        record = self.table.on_refused(refused)
        if record is not None and record.error is refused:
            self._close_streams(record)
            self._deliver(record, refused)
            self._readmit()

    # ---- routing (tasks in the engine's nursery) --------------------------------

    async def route_tokenized(self, rx: RingReceiver, worker: int) -> None:
        async for msg in frames(rx):
            self._tok_queues.answered(msg.rid, worker)
            if isinstance(msg, Tokenized):
                record = self.table.on_tokenized(msg)
                if record is None:
                    continue
                self._wake_tokenized(msg.rid)
                record.progress_at = time.monotonic()
                self._open_streams(record)
                if record.sent_epoch != self._epoch and not record.held:
                    # the scheduler restarted after it may have taken it in, before these ids
                    # came: the restart could not resubmit it (a duplicate is known by rid)
                    self._resubmit(record)
            elif isinstance(msg, Refused):
                self._fail(msg)

    async def _to_tokenizer(self, req: GenerateRequest, avoid: set[int] | None = None) -> None:
        worker = self._tok_queues.choose(self._sup.status, avoid)  # (a live one, in turn)
        queues = self._tok_queues
        queues.sending(req.rid)  # (waiting for room: watch_stalls leaves it)
        try:  # (numbered in the ring's order: its answers come in that order)
            await self._to_tok[worker].send(req, False, lambda: queues.sent(worker, req.rid))
        except BaseException as err:
            queues.unsent(req.rid)
            if isinstance(err, errors.ResourceExhausted):  # /dev/shm (or fds) full: refused
                raise errors.refused_for_room(err) from err
            raise

    async def route_deltas(self) -> None:
        async for msg in frames(self._from_detok):
            if isinstance(msg, StreamDeltas):
                self._on_deltas(msg)
            elif isinstance(msg, DetokenizerUp) and msg.incarnation > 1:
                # all its predecessor sent is handled: rebuild every live stream from the table
                log.warning("detokenizer restarted (incarnation %d)", msg.incarnation)
                for record in self.table.live():
                    self._open_streams(record)

    def _on_deltas(self, msg: StreamDeltas) -> None:
        for delta in msg.deltas:
            try:
                update = self.table.on_delta(delta, msg.stepped_at)
            except OutputGap as gap:
                self._resume(self.table.records[delta.rid], str(gap))
                continue
            if update is None:
                continue
            record = self.table.records[delta.rid]
            record.progress_at = time.monotonic()
            self._deliver(record, update)
            if record.finished:
                self._finish(record)
            elif isinstance(delta.matched_stop, str) and delta.finish_reason == "stop":
                # one of n samples stopped by a string, which the scheduler cannot see
                self._queue(self._to_sched, FinishNow(record.rid, delta.index))
        for refused in msg.refused:
            self._fail(refused)
        for key, epoch, attempt in msg.gaps:
            owner = self.table.records.get(key.rpartition("/")[0])
            if owner is not None and (epoch, attempt) == (owner.epoch, owner.attempt):
                self._resume(owner, f"stream {key}: the detokenizer lacks a frame before")
        for key in msg.unknown:  # parked tokens with no open: drop them if their end came
            rid, _, index = key.rpartition("/")
            owner = self.table.records.get(rid)
            if owner is None:  # gone: nothing may run for it either
                self._queue(self._to_sched, Abort(rid, if_running=True))
            if owner is None or owner.finished or owner.seqs[int(index)].finish_reason:
                self._queue(self._to_detok, CloseStream(key))
            else:  # its open may have been lost: opening again merges (idempotent)
                self._open_streams(owner, int(index))  # (that one: all n were n² opens)
        if msg.stats is not None:
            self._stats.set(msg.stats)
        if msg.detok is not None:
            self._detok_stats.set(msg.detok)

    def _queue(self, out: Out, msg: Any) -> None:
        self.controls.queue(out, msg)

    # ---- recovery ------------------------------------------------------------------

    def _tell_pause(self) -> None:
        """Tell a restarted scheduler, which starts paused, whether to stay so."""
        op = "pause" if self._paused else "continue"
        self._queue(self._to_sched, Control(op, next(self._control_seq)))

    async def watch_scheduler(self) -> None:
        """Each new scheduler incarnation is a new epoch (see the module docstring)."""
        if self._epoch > 1:  # restarted before this engine was made
            self._tell_pause()
        while True:
            status = await self._sup.wait_for(
                lambda s: (
                    s.actor(SCHEDULER).state is ActorState.RUNNING
                    and s.actor(SCHEDULER).incarnation > self._epoch
                )
            )
            scheduler = status.actor(SCHEDULER)
            in_step = scheduler.request_crashes > self._charged  # else: ran none of their work
            self._epoch, self._charged = scheduler.incarnation, scheduler.request_crashes
            log.warning("scheduler restarted (epoch %d, died in a step: %s)", self._epoch, in_step)
            for record in self.table.on_scheduler_crash(in_step):
                self._fail(
                    Refused(
                        record.rid,
                        "RequestFailedError",
                        f"request {record.user_rid} was in flight for {record.crashes} "
                        "scheduler crashes, the last with no other suspect beside it; "
                        "it fails alone so that the others go on",
                    )
                )
            self.table.new_epoch(self._epoch)
            self._stats.poke()  # controls waiting for the dead scheduler's answer resend
            self._tell_pause()
            for record in self.table.live():
                self._open_streams(record)
                if record.held:
                    self._queue(self._to_sched, Abort(record.rid))  # its frames, if any, drop
                else:
                    self._resubmit(record)
            self._readmit()

    async def watch_stalls(self) -> None:
        """Send again a request with no news for ``stall_timeout`` (then twice as long,
        …): a frame lost on its way (a bug, a fault plan's drop) would hang it for good.
        Idempotent: a tokenizer tokenizes it again, the table keeps the first ids; the
        scheduler drops a rid it holds, resumes one it lost from the table's. A second
        copy, the scheduler idle, is a new attempt (its last frame lost, the detokenizer
        took the first copy's tokens for ones it had passed: it hung for good)."""
        timeout = self.options.stall_timeout
        if not timeout:
            return
        steps, moved_at = -1, 0.0  # the scheduler's step count, when it last changed
        while True:
            await trio.sleep(timeout / 4)
            status = self._sup.status()
            if self._paused or not status.healthy:
                continue  # no news is expected; a restart resubmits everything anyway
            now, at_work = time.monotonic(), self._tok_queues.at_work(status)
            stats = self._stats.value  # a scheduler at work on a queue (QUEUE_PATIENCE)
            if stats is not None and stats.steps != steps:
                steps, moved_at = stats.steps, now
            window, patience = max(timeout, 2 * BUSY_REPORT_EVERY_S), QUEUE_PATIENCE * timeout
            queueing = stats is not None and stats.waiting > 0 and now - moved_at < window
            stalled = [
                r
                for r in self.table.live()
                if not (queueing and r.input_ids is not None and now - r.progress_at < patience)
                and self._stalled(r, now, timeout, at_work)
            ]
            if stalled:  # one line a pass: an overload stalls hundreds at once
                shown = ", ".join(f"{r.user_rid} ({r.redrives + 1})" for r in stalled[:3])
                since, more = min(now - r.progress_at for r in stalled), len(stalled) > 3
                log.warning(STALLED, len(stalled), since, shown, ", …" if more else "")
            for record in (r for r in stalled if not r.finished):  # (lazily: sends wait)
                record.redrives, record.redriven_at = record.redrives + 1, now
                if record.input_ids is None:  # lost before its ids came back: tokenize again
                    # (from here, not queued: a full tokenizer ring must not hold up controls)
                    try:
                        await self._to_tokenizer(record.req, avoid=at_work)
                    except errors.RequestError as err:  # /dev/shm full: refused alone
                        self._fail(Refused(record.rid, type(err).__name__, str(err)))
                elif record.redrives > 1 and now - moved_at >= window:  # a copy brought
                    self._resume(record, "no news after a copy")  # nothing, no step runs
                else:
                    self._resubmit(record)

    def _stalled(self, record: Record, now: float, timeout: float, at_work: set[int]) -> bool:
        """No news for its timeout, and not queued behind its tokenizer's backlog."""
        since = now - max(record.progress_at, record.redriven_at)  # (its last copy's too)
        if record.held or since < timeout * 2**record.redrives:
            return False
        queues = self._tok_queues
        return record.input_ids is not None or not queues.queued(record.rid, now, timeout, at_work)

    def _open_streams(self, record: Record, index: int | None = None) -> None:
        if record.input_ids is not None:
            for op in self.table.open_streams(record, index):
                self._queue(self._to_detok, op)

    def _resume(self, record: Record, why: str) -> None:
        """A frame of ``record``'s output was lost: resume it alone, at its next attempt."""
        if record.finished or record.held:
            return  # nothing to resume; a held one is resubmitted when readmitted
        log.warning("%s; resuming request %s alone", why, record.user_rid)
        self.table.new_attempt(record)
        record.progress_at = time.monotonic()
        self._open_streams(record)
        self._resubmit(record)

    def _readmit(self) -> None:
        """Readmit the next group held back, once nothing else is in flight."""
        for record in self.table.next_group():
            self._resubmit(record)
        self._quarantine_changed.set()
        self._quarantine_changed = trio.Event()

    def _resubmit(self, record: Record) -> None:
        sub = self.table.resubmission(record)
        if sub is not None:  # else its ids are unknown: their arrival sends it
            record.sent_epoch = self._epoch
            self._queue(self._to_sched, sub)

    # ---- shutdown -------------------------------------------------------------------

    @contextmanager
    def hold(self) -> Iterator[None]:
        """A caller answering for requests that left the table: a drain waits for it."""
        self._holds += 1
        try:
            yield
        finally:
            self._holds -= 1

    @property
    def held(self) -> bool:
        """Whether a caller is still answering for a request (see hold())."""
        return self._holds > 0

    def refuse_live(self, message: str) -> None:
        """Fail every request in flight alone, with EngineShutdownError."""
        self.gave_up = True  # (and refuse what comes after: no error would reach it)
        for record in self.table.live():
            self._fail(Refused(record.rid, "EngineShutdownError", message))

    def close(self) -> None:
        self._closing = True
        for scope in (s for waits in self._arriving.values() for s in waits):
            scope.cancel()  # (waiting for an actor: EngineShutdownError at once)
        self._stats.close()  # (a control or a stats waiter: EngineShutdownError)
        self._detok_stats.close()
        cut = "the engine shut down before the request finished"
        for rid, waiter in list(self._waiters.items()):
            record = self.table.records.get(rid)
            if record is not None and not record.finished:
                waiter.send_nowait(Refused(rid, "EngineShutdownError", cut))
            waiter.close()
        for end in (*self._to_tok, self._to_sched, self._to_detok):
            end.tx.close()
        for rx in (*self._from_tok, self._from_detok):
            rx.close()

"""The scheduler actor: the engine core in a trio loop.

One task per inbox (each tokenizer worker's ring, the frontend's control
ring) receives frames. New requests wait in a list and join the core between
steps (``add_request`` must not overlap a step), and their frames are
committed once they are in; anything adding one raises refuses that request
alone. A request the core holds or has queued is not added twice: a frame
redelivered after a tokenizer restart and the frontend's resubmission after a
scheduler restart are both recognised by rid (ring rids are unique per
request). Nothing per request is kept past the request's end, except a
tombstone (below) for at most ``TOMBSTONE_TTL_S``.

Aborts and "finish now" go to the core at once (they are thread-safe). One
for a request the core does not hold yet (its ``Scheduled`` is still queued,
or still on another ring: a tokenizer's) leaves a tombstone, and that
``Scheduled`` is dropped when it comes. A tombstone also expires after
``TOMBSTONE_TTL_S``: without remembering every rid the scheduler cannot tell
an abort that overtook its request from one for a request that already ended
here (a client that cancels as its last token comes), whose ``Scheduled``
never comes. The TTL is far beyond the time a ``Scheduled`` trails its abort
(a ring hop, or a tokenizer restart); one later than that runs unwatched, and
the frontend ends it as unknown.

A ``Scheduled`` of a later *attempt* than the one the core holds for its rid
(the frontend resuming that request alone after a gap in its output) replaces
it: the held one is aborted, and the new one joins once the abort has been
applied (``replacing``). Its frames carry the new attempt, so what is still in
flight of the old one is dropped downstream.

An operator's ``Control`` (pause, continue, flush the prefix cache) is
committed at once, applied between two steps and answered with a stats
report; while paused no forward pass runs, but aborts and finishes are still
applied (their KV freed) and refusals still go out.

A step that may prefill runs in a worker thread, so aborts and heartbeats
keep flowing while the model computes; a decode-only step runs inline when
decode steps have been fast (``StepPlacement``). Wherever it runs, a step is
work on requests (``ctx.handling_requests``): it must end within the
watchdog timeout, or the supervisor counts the scheduler as hung (its
heartbeat timer beating on meanwhile does not count), kills it and charges
the death to the requests in the step. Each step's new tokens, for
every request, go to the detokenizer in one frame stamped with this
incarnation's epoch, each sequence's ids with their offset in its output
(a resubmission's prior tokens included). A step with nothing to report (under
overlap scheduling, a prefill alone: its token is read at the next step)
sends no frame, which would only wake the detokenizer.
"""

from __future__ import annotations

import logging
import math
import time

import torch
import trio

from rt.actors import Actor, ActorContext
from rt.errors import RequestError
from rt.gpu.engine import EngineCore
from rt.gpu.engine_config import EngineConfig
from rt.gpu.request import StepOutput
from rt.messages import (
    BUSY_REPORT_EVERY_S,
    Abort,
    Control,
    FinishNow,
    Refused,
    Scheduled,
    SchedulerStats,
    SeqTokens,
    StepTokens,
)
from rt.pipeline.mail import receive, send
from rt.shm import Frame
from rt.tok.core import refuse

log = logging.getLogger(__name__)
OUT = "sched-detok"
FRONT = "front-sched"  # the frontend's ring: resubmissions, aborts, finish-now
# A decode step this short (moving average) runs on the trio thread: handing it to
# a worker thread costs two cross-thread wakes, each ~0.1-0.2 ms of CPU on this
# VM, more than the step.
INLINE_STEP_S = 0.001
IDLE_CHECK_S = 0.05
# The idle KV check walks the whole pool on the trio thread (0.2 s for a million
# tokens here): it takes at most this share of the time, however big the pool.
CHECK_SHARE = 0.02
TOMBSTONE_TTL_S = 30.0  # see the module docstring
GEN_WINDOW_STEPS = 40  # decode steps a last_gen_throughput is measured over


class StepPlacement:
    """Where the next step runs: on the trio thread (inline) or in a worker thread.

    Decided from the step about to run, not from past steps alone: one that may
    prefill goes to the thread (a prompt's length, hence the step's, is not
    bounded by anything seen before: a first long prefill after fast decodes
    would block the trio thread); a decode-only step runs inline while the
    moving average of decode steps is under ``INLINE_STEP_S``. The first decode
    step, not yet measured, goes to the thread.
    """

    def __init__(self, inline_s: float = INLINE_STEP_S) -> None:
        self.inline_s = inline_s
        self.decode_s: float | None = None  # moving average of decode steps, seconds

    def inline(self, engine: EngineCore) -> bool:
        if engine.next_step_prefills:
            return False
        return self.decode_s is not None and self.decode_s < self.inline_s

    def record(self, out: StepOutput, seconds: float) -> None:
        """Account a step's own compute time (not the hand-over to a thread)."""
        if out.forward_mode != "decode":
            return
        if self.decode_s is None:
            self.decode_s = seconds
        else:
            self.decode_s += 0.2 * (seconds - self.decode_s)


class GenThroughput:
    """SGLang's ``last_gen_throughput``: the tokens decode steps made a second, over
    the last GEN_WINDOW_STEPS of them (its decode log's interval), or fewer when the
    scheduler went idle or paused first. Time between steps counts; idle or paused
    time does not."""

    def __init__(self) -> None:
        self.last = 0.0  # tokens/s of the last closed window (0.0 before the first)
        self._tokens = self._steps = 0
        self._since = self._until = 0.0

    def step(self, out: StepOutput, started: float) -> None:
        if out.forward_mode != "decode":
            return
        if not self._steps:
            self._since = started
        self._tokens += sum(len(o.token_ids) for o in out.outputs)
        self._steps += 1
        self._until = time.monotonic()
        if self._steps >= GEN_WINDOW_STEPS:
            self.close()

    def close(self) -> None:
        """End the window (the scheduler goes idle): its figure is the last."""
        if self._steps:
            self.last = self._tokens / max(self._until - self._since, 1e-9)
            self._tokens = self._steps = 0


class SchedulerActor(Actor):
    fault_points = frozenset({"step", "forward"})

    def __init__(self, config: EngineConfig, inboxes: tuple[str, ...]) -> None:
        self.config = config
        self.inboxes = inboxes

    async def startup(self, ctx: ActorContext) -> None:
        self.engine = await trio.to_thread.run_sync(EngineCore, self.config)
        self.placement = StepPlacement()
        # before it reports up (and /health says 200): the first requests would pay
        # for the kernels' compiles and the libraries' first calls (GPU TTFT p99)
        start = time.monotonic()
        steps = await trio.to_thread.run_sync(self._warm_up)
        log.info("warmed up in %d steps, %.2f s", steps, time.monotonic() - start)
        self.epoch = ctx.incarnation
        self.incoming: list[tuple[Scheduled, str, Frame]] = []
        # rid -> trio deadline, in deadline order (one TTL, set in time order)
        self.tombstones: dict[str, float] = {}
        self.refused: list[Refused] = []
        # rid -> a later attempt, added once the core has let go of the one it holds
        self.replacing: dict[str, Scheduled] = {}
        self.wakeup = trio.Event()
        self.steps = 0
        self.reported = False  # whether this idle spell's state was reported
        self.report_due = 0.0  # time.monotonic() of the next report while busy
        self.throughput = GenThroughput()
        self.integrity_ok = True  # the last idle check's verdict
        self.check_s, self.checked_at = 0.0, -math.inf  # how long it took, and when
        self.reported_requests = 0  # the request records the last report counted
        self.controls: list[Control] = []  # applied between two steps, in arrival order
        # a successor starts paused, until the frontend says whether the operator paused
        # generation (else it would run a few steps of a paused engine's requests first)
        self.paused = ctx.incarnation > 1
        self.control, self.control_ok = 0, True  # the last Control applied

    async def run(self, ctx: ActorContext) -> None:
        async with trio.open_nursery() as nursery:
            for name in self.inboxes:
                nursery.start_soon(self._receive, ctx, name)
            await self._loop(ctx)

    async def _receive(self, ctx: ActorContext, name: str) -> None:
        inbox = ctx.inbox[name]
        while True:
            msg, frame = await receive(inbox)
            if isinstance(msg, Scheduled):
                self.incoming.append((msg, name, frame))
            elif isinstance(msg, Abort | FinishNow):
                # The commit also releases resubmissions received before it on this
                # ring and not yet admitted: if this scheduler dies first, the next
                # restart resends them.
                self._stop(msg)
                inbox.commit(frame)
            elif isinstance(msg, Control):
                # committed at once: if this scheduler dies before acknowledging it,
                # the frontend sends it again to the next one
                self.controls.append(msg)
                inbox.commit(frame)
            else:  # corruption: never a crash loop
                log.error("scheduler: dropped a %s frame on %s", type(msg).__name__, name)
                inbox.commit(frame)
            self.wakeup.set()

    def _stop(self, msg: Abort | FinishNow) -> None:
        """End the request in the core, or tombstone it if its Scheduled is queued or
        not here yet. Runs on the trio thread while a step may run in another: the
        core's ``reqs`` only loses a rid there (a request ending, and then
        ``abort`` is a no-op); only ``_admit``, on this thread, adds one."""
        rid = msg.rid
        held = rid in self.engine.reqs
        if isinstance(msg, FinishNow) and msg.index is not None:
            if held:  # (else ended, or resubmitted: the front resends what is left)
                self.engine.finish(rid, msg.index)
            return  # one sample: never a tombstone, which would drop the whole request
        if not held and isinstance(msg, Abort) and msg.if_running:
            return
        if held:
            (self.engine.abort if isinstance(msg, Abort) else self.engine.finish)(rid)
        if isinstance(msg, Abort):
            self.replacing.pop(rid, None)
        if not held or any(m.rid == rid for m, _, _ in self.incoming):
            self.tombstones.pop(rid, None)
            self.tombstones[rid] = trio.current_time() + TOMBSTONE_TTL_S

    async def _loop(self, ctx: ActorContext) -> None:
        while True:
            await ctx.tick()
            self._expire_tombstones()
            if self.controls:
                await self._apply_controls(ctx)
            self._admit(ctx)
            if self.paused:
                await self._paused(ctx)
                continue
            if not self.engine.has_work and not self.refused:
                await self._idle(ctx)
                continue
            await ctx.faults.point("step")
            inline = self.placement.inline(self.engine)
            started = time.monotonic()
            # a death inside is charged to the requests in hand, not to this actor
            with ctx.handling_requests():
                if inline:
                    out = self._step(ctx)
                else:
                    out = await trio.to_thread.run_sync(self._step, ctx)
            if inline:
                await trio.lowlevel.checkpoint()
            self.throughput.step(out, started)
            stats = None
            if time.monotonic() >= self.report_due:
                stats = self._stats(check=False)
                self.report_due = time.monotonic() + BUSY_REPORT_EVERY_S
            if out.outputs or self.refused or stats is not None:
                await send(ctx.outbox[OUT], self._frame(out, stats))
            else:  # a prefill whose token the next step reads: nothing to wake the detokenizer for
                self.steps += 1

    async def _idle(self, ctx: ActorContext) -> None:
        """Wait for work. Once idle for IDLE_CHECK_S, check the KV invariants (a
        walk over the whole pool: not worth doing between every two requests)
        and report the scheduler's state; report again when tombstones expire,
        so that a report with no request record left comes."""
        with trio.move_on_after(IDLE_CHECK_S):
            await self.wakeup.wait()
        self.throughput.close()
        while not self.wakeup.is_set():
            if not self.reported:
                await send(ctx.outbox[OUT], self._frame(StepOutput(), self._stats()))
                self.reported = True
            # late by up to a second, so that expiries spread over time come in one report
            next_expiry = next(iter(self.tombstones.values()), math.inf) + 1.0
            with trio.move_on_at(next_expiry):
                await self.wakeup.wait()
            if self._expire_tombstones():
                self.reported = False
        self.wakeup = trio.Event()

    async def _apply_controls(self, ctx: ActorContext) -> None:
        """Apply the operator's commands (no step runs meanwhile), then acknowledge
        the last with a stats report."""
        controls, self.controls = self.controls, []
        for msg in controls:
            ok = True
            if msg.op == "pause":
                self.paused = True
            elif msg.op == "retract":
                self.paused = True
                out = self.engine.apply_commands()  # (the last step's tokens reported first)
                await send(ctx.outbox[OUT], self._frame(out, self._stats()))
                log.info("paused: retracted %d request(s)", self.engine.retract_all())
            elif msg.op == "continue":
                self.paused = False
            elif msg.op == "flush_cache":
                # as SGLang's: only with no request holding KV (theirs is in the tree); one
                # that waits, not admitted yet (sent while paused, as an RL trainer's
                # pause, flush, continue may find), holds none; finishes and aborts that
                # came before it are applied first
                if self.engine.has_commands:
                    out = self.engine.apply_commands()
                    await send(ctx.outbox[OUT], self._frame(out, self._stats()))
                ok = not (self.engine.holds_kv or self.engine.has_pending)
                if ok:
                    freed = self.engine.flush_cache()
                    log.info("flushed the prefix cache (%d tokens)", freed)
            else:  # an op this scheduler does not know: refused, never a crash
                log.error("scheduler: unknown control %r", msg.op)
                ok = False
            self.control, self.control_ok = msg.seq, ok
        await send(ctx.outbox[OUT], self._frame(StepOutput(), self._stats()))

    async def _paused(self, ctx: ActorContext) -> None:
        """Generation is paused: no forward pass runs, but aborts and finishes
        still end their requests (and free their KV), and refusals still go out."""
        self.throughput.close()  # (a pause is no decode time)
        if self.engine.has_commands or self.engine.has_pending or self.refused:
            # cheap: reports the last step's tokens, frees KV, runs no model
            out = self.engine.apply_commands()
            await send(ctx.outbox[OUT], self._frame(out, self._stats()))
            return
        if self.num_request_records != self.reported_requests:  # one came (or went): say so
            await send(ctx.outbox[OUT], self._frame(StepOutput(), self._stats()))
            return
        with trio.move_on_after(IDLE_CHECK_S):
            await self.wakeup.wait()
        self.wakeup = trio.Event()

    def _expire_tombstones(self) -> bool:
        now, expired = trio.current_time(), False
        while self.tombstones:
            rid, deadline = next(iter(self.tombstones.items()))
            if deadline > now:
                break
            del self.tombstones[rid]
            expired = True
        return expired

    def _threads(self) -> None:
        threads = self.config.torch_threads
        if threads is not None and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)  # per thread under OpenMP: steps run in several

    def _warm_up(self) -> int:
        self._threads()
        return self.engine.warm_up(self.placement.record)

    def _step(self, ctx: ActorContext) -> StepOutput:
        self.reported = False
        ctx.faults.check("forward", self._fault_key() if ctx.faults.keyed("forward") else None)
        if not self.engine.has_work:
            return StepOutput()
        self._threads()
        start = time.perf_counter()
        out = self.engine.step()
        self.placement.record(out, time.perf_counter() - start)
        return out

    def _fault_key(self) -> str:
        """What a fault plan's ``match`` looks for at ``forward``: the prompt ids of
        every request in the core, each as `` 1 2 3 `` (a request whose shape makes
        the forward pass die, as a kernel fault would)."""
        return "|".join(
            f" {' '.join(map(str, reqs[0].input_ids))} " for reqs in self.engine.reqs.values()
        )

    def _admit(self, ctx: ActorContext) -> None:
        for rid in [rid for rid in self.replacing if rid not in self.engine.reqs]:
            self._add(self.replacing.pop(rid))  # its predecessor's abort is applied
        batch, self.incoming = self.incoming, []
        last: dict[str, Frame] = {}
        for msg, inbox, frame in batch:
            last[inbox] = frame
            stopped = self.tombstones.pop(msg.rid, None) is not None
            if stopped and inbox != FRONT:
                continue  # stopped before it got here
            # (a resubmission from the frontend overrides an abort: the frontend holds
            # suspects back after a scheduler crash by aborting them, and readmits them)
            held = self.engine.reqs.get(msg.rid)
            if held is not None:
                waiting = self.replacing.get(msg.rid)
                if msg.attempt > (waiting.attempt if waiting else held[0].attempt):
                    self.engine.abort(msg.rid)  # a resumption of it alone: replace it
                    self.replacing[msg.rid] = msg
                continue  # else a duplicate: redelivered by a restarted tokenizer, or resubmitted
            self._add(msg)
        for inbox, frame in last.items():
            ctx.inbox[inbox].commit(frame)

    def _add(self, msg: Scheduled) -> None:
        """Hand a request to the core; whatever that raises refuses this request alone."""
        try:
            input_ids = msg.input_ids.tolist()
            output_ids = [ids.tolist() for ids in msg.output_ids]
        except Exception as err:
            self.refused.append(
                Refused(
                    msg.rid,
                    "InvalidRequestError",
                    f"scheduled request: expected input_ids and output_ids as arrays of token "
                    f"ids, got {type(err).__name__}: {err}",
                )
            )
            return
        try:
            self.engine.add_request(
                msg.rid,
                input_ids,
                msg.sampling,
                output_ids=output_ids,
                finished=msg.finished,
                priority=msg.priority,
                attempt=msg.attempt,
                to_context=msg.to_context,
            )
        except RequestError as err:
            self.refused.append(refuse(msg.rid, err))
        except Exception as err:
            log.exception("scheduler: adding request %s failed", msg.rid)
            self.refused.append(
                Refused(
                    msg.rid,
                    "RequestFailedError",
                    f"the scheduler could not admit the request ({type(err).__name__}: {err}); "
                    "other requests go on. This is a bug in rt: please report it",
                )
            )

    @property
    def num_request_records(self) -> int:
        """Per-request records held here and in the core; 0 once every request ended."""
        return (
            len(self.engine.reqs)
            + len(self.incoming)
            + len(self.tombstones)
            + len(self.refused)
            + len(self.replacing)
        )

    def _stats(self, check: bool = True) -> SchedulerStats:
        """Reported each time the core goes idle, with its KV invariants checked,
        and every BUSY_REPORT_EVERY_S while busy (with the last check's verdict)."""
        if check and time.monotonic() - self.checked_at >= self.check_s / CHECK_SHARE:
            started = time.monotonic()
            try:
                self.engine.check_integrity()
                self.integrity_ok = True
            except AssertionError:
                log.exception("KV integrity check failed")
                self.integrity_ok = False
            self.checked_at = time.monotonic()
            self.check_s = self.checked_at - started
        stats = self.engine.stats()
        self.reported_requests = self.num_request_records
        return SchedulerStats(
            steps=self.steps,
            running=stats.num_running,
            waiting=stats.num_waiting,
            # a prefix a running request reads is its KV, though the tree holds it too:
            # only what the tree alone holds (evictable) is the cache's
            request_tokens=stats.max_total_tokens - stats.free_tokens - stats.evictable_tokens,
            cached_tokens=stats.evictable_tokens,
            free_tokens=stats.free_tokens,
            integrity_ok=self.integrity_ok,
            retractions=stats.num_retractions,
            requests=self.num_request_records,
            paused=self.paused,
            control=self.control,
            control_ok=self.control_ok,
            last_gen_throughput=self.throughput.last,
        )

    def _frame(self, out: StepOutput, stats: SchedulerStats | None = None) -> StepTokens:
        seqs = tuple(
            SeqTokens(
                rid=o.rid,
                index=o.index,
                token_offset=o.token_offset,
                ids=tuple(o.token_ids),
                finish_reason=o.finish_reason,
                matched_stop=o.matched_stop,
                logprobs=tuple(o.logprobs) if o.logprobs is not None else None,
                top_logprobs=o.top_logprobs,
                prompt_tokens=o.prompt_tokens,
                cached_tokens=o.cached_tokens,
                seed=o.seed,
                admitted_at=o.admitted_at,
                prompt_logprobs=tuple(o.prompt_logprobs) if o.prompt_logprobs is not None else None,
                prompt_top_logprobs=o.prompt_top_logprobs,
                attempt=o.attempt,
            )
            for o in out.outputs
        )
        self.steps += 1
        refused, self.refused = tuple(self.refused), []
        return StepTokens(self.steps, seqs, refused, stats, time.monotonic(), epoch=self.epoch)

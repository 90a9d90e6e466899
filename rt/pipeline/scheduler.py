"""The scheduler actor: the engine core in a trio loop.

One task per inbox (each tokenizer worker's ring, the frontend's control
ring) receives frames. Aborts and "finish now" go to the core at once (they
are thread-safe); new requests wait in a list and join the core between steps
(``add_request`` must not overlap a step), and their frames are committed
once they are in. A request the core has seen is not added twice: a frame
redelivered after a tokenizer restart and the frontend's resubmission after
a scheduler restart are both recognised by rid.

The step runs in a worker thread, so aborts and heartbeats keep flowing while
the model computes. Each step's new tokens, for every request, go to the
detokenizer in one frame, token ids as arrays, each with its offset in the
request's output.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

import numpy as np
import trio

from rt.actors import Actor, ActorContext
from rt.errors import RequestError
from rt.gpu.engine import EngineCore
from rt.gpu.engine_config import EngineConfig
from rt.gpu.request import StepOutput
from rt.messages import (
    Abort,
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
# A step this short (moving average) runs on the trio thread: handing it to a
# worker thread costs two cross-thread wakes, each ~0.1-0.2 ms of CPU on this
# VM, more than the step. Anything longer runs off the trio thread, so aborts
# and heartbeats keep flowing while the model computes.
INLINE_STEP_S = 0.001
IDLE_CHECK_S = 0.05
REMEMBERED_RIDS = 100_000  # rids admitted or ended, kept to recognise late duplicates


class SchedulerActor(Actor):
    fault_points = frozenset({"step", "forward"})

    def __init__(self, config: EngineConfig, inboxes: tuple[str, ...]) -> None:
        self.config = config
        self.inboxes = inboxes

    async def startup(self, ctx: ActorContext) -> None:
        self.engine = await trio.to_thread.run_sync(EngineCore, self.config)
        self.incoming: list[tuple[Scheduled, str, Frame]] = []
        self.seen: OrderedDict[str, None] = OrderedDict()
        self.offsets: dict[tuple[str, int], int] = {}
        self.refused: list[Refused] = []
        self.wakeup = trio.Event()
        self.steps = 0
        self.step_ewma = 1.0  # seconds; starts high: the first steps go to the thread
        self.reported = False  # whether this idle spell's state was reported

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
                # Remembered, so that a request still waiting to be admitted is
                # skipped; the core ends it if it is already in. The commit also
                # releases resubmissions received before it on this ring and not yet
                # admitted: if this scheduler dies first, the next restart resends them.
                self._remember(msg.rid)
                (self.engine.abort if isinstance(msg, Abort) else self.engine.finish)(msg.rid)
                inbox.commit(frame)
            else:
                raise TypeError(f"scheduler: unexpected {type(msg).__name__} on {name}")
            self.wakeup.set()

    async def _loop(self, ctx: ActorContext) -> None:
        while True:
            await ctx.tick()
            self._admit(ctx)
            if not self.engine.has_work and not self.refused:
                await self._idle(ctx)
                continue
            await ctx.faults.point("step")
            start = time.perf_counter()
            if self.step_ewma < INLINE_STEP_S:
                out = self._step(ctx)
                await trio.lowlevel.checkpoint()
            else:
                out = await trio.to_thread.run_sync(self._step, ctx)
            self.step_ewma += 0.2 * (time.perf_counter() - start - self.step_ewma)
            await send(ctx.outbox[OUT], self._frame(out))

    async def _idle(self, ctx: ActorContext) -> None:
        """Wait for work. Once idle for IDLE_CHECK_S, check the KV invariants (a
        walk over the whole pool: not worth doing between every two requests)
        and report the scheduler's state."""
        with trio.move_on_after(IDLE_CHECK_S):
            await self.wakeup.wait()
        if not self.wakeup.is_set() and not self.reported:
            await send(ctx.outbox[OUT], self._frame(StepOutput(), self._stats()))
            self.reported = True
            await self.wakeup.wait()
        self.wakeup = trio.Event()

    def _step(self, ctx: ActorContext) -> StepOutput:
        self.reported = False
        ctx.faults.check("forward")
        return self.engine.step() if self.engine.has_work else StepOutput()

    def _admit(self, ctx: ActorContext) -> None:
        batch, self.incoming = self.incoming, []
        last: dict[str, Frame] = {}
        for msg, inbox, frame in batch:
            last[inbox] = frame
            if msg.rid in self.seen:
                continue
            self._remember(msg.rid)
            prior = msg.output_ids[0] if len(msg.output_ids) == 1 else np.zeros(0, np.int64)
            try:
                self.engine.add_request(
                    msg.rid,
                    msg.input_ids.tolist(),
                    msg.sampling,
                    output_ids=prior.tolist(),
                    priority=msg.priority,
                )
            except RequestError as err:
                self.refused.append(refuse(msg.rid, err))
                continue
            for index in range(msg.sampling.n):
                self.offsets[(msg.rid, index)] = len(prior)
        for inbox, frame in last.items():
            ctx.inbox[inbox].commit(frame)

    def _remember(self, rid: str) -> None:
        self.seen[rid] = None
        if len(self.seen) > REMEMBERED_RIDS:
            self.seen.popitem(last=False)

    def _stats(self) -> SchedulerStats:
        """Reported each time the core goes idle, with its KV invariants checked."""
        try:
            self.engine.check_integrity()
            ok = True
        except AssertionError:
            log.exception("KV integrity check failed")
            ok = False
        stats = self.engine.stats()
        return SchedulerStats(
            steps=self.steps,
            running=stats.num_running,
            waiting=stats.num_waiting,
            request_tokens=stats.max_total_tokens - stats.free_tokens - stats.cached_tokens,
            cached_tokens=stats.cached_tokens,
            free_tokens=stats.free_tokens,
            integrity_ok=ok,
            retractions=stats.num_retractions,
        )

    def _frame(self, out: StepOutput, stats: SchedulerStats | None = None) -> StepTokens:
        seqs = []
        for o in out.outputs:
            key = (o.rid, o.index)
            offset = self.offsets.get(key, 0)
            self.offsets[key] = offset + len(o.token_ids)
            if o.finish_reason is not None:
                self.offsets.pop(key, None)
            seqs.append(
                SeqTokens(
                    rid=o.rid,
                    index=o.index,
                    token_offset=offset,
                    ids=tuple(o.token_ids),
                    finish_reason=o.finish_reason,
                    matched_stop=o.matched_stop,
                    logprobs=tuple(o.logprobs) if o.logprobs is not None else None,
                    top_logprobs=o.top_logprobs,
                    prompt_tokens=o.prompt_tokens,
                    cached_tokens=o.cached_tokens,
                    seed=o.seed,
                )
            )
        self.steps += 1
        refused, self.refused = tuple(self.refused), []
        return StepTokens(self.steps, tuple(seqs), refused, stats, time.monotonic())

"""The front: what the HTTP layer keeps about the engine requests it runs.

* admission: past ``max_running_requests + max_queued_requests`` generations
  in flight, a new one is refused with 503 and ``Retry-After``; those already
  accepted are not touched;
* the rids in flight, each with a cancel scope, for ``/abort_request``;
* per-request timings and counts for ``/metrics``;
* the scheduler's latest report (it reports when it goes idle);
* the mapping from rt's errors to HTTP answers;
* the turn in which a big body is parsed (:meth:`Front.parse`).
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import trio
from prometheus_client import Histogram
from pydantic import BaseModel

from rt import errors
from rt.frontend.health import unhealthy
from rt.gpu.model_dir import read_model_dir
from rt.http.asgi import HTTPError
from rt.http.engine_port import Delta
from rt.http.metrics import EngineState, Metrics
from rt.http.schemas import parse
from rt.http.settings import Settings
from rt.http.tokens import Encoder, TokenTexts
from rt.messages import SchedulerStats

M = TypeVar("M", bound=BaseModel)
# A body this big is parsed in its turn, one at a time, and the next such parse waits
# as long as the last one took: parsing holds the event loop (~0.2 s for 15 MiB of
# token ids), and 20 such bodies at once held it 3.6 s (/health takes several rounds of
# the loop, and each round had one parse in it while they took turns).
BIG_BODY = 1 << 20


class Tracked:
    """One engine request in flight: abortable by rid, and timed."""

    def __init__(
        self, front: Front, rid: str, batch: str | None, counted: bool = True, defer: bool = False
    ) -> None:
        self.front = front
        self.counted = counted  # its figures go to the metrics (not a health probe's)
        # its TTFT and gaps, kept to observe with its counts (a whole answer's: a refused
        # batch's are not), or observed as they come (None: a stream's)
        self.deferred: list[tuple[Histogram, float]] | None = [] if defer else None
        self.rid = rid
        self.batch = batch
        self.arrived = time.monotonic()
        self.first_token_at: float | None = None
        self.scope = trio.CancelScope()
        self.abort_cause: str | None = None
        self.stream: Any = None  # its engine stream, once opened
        self._last: dict[int, float] = {}

    @property
    def generating(self) -> bool:
        """The engine has not ended it (a client slow to read what was made holds
        its place in the table, not in the engine)."""
        return self.stream is None or not self.stream.ended

    def abort(self, cause: str) -> bool:
        """Abort it; whether it was not aborted already (one unwinding, its client
        slow to take the end, was counted again by every later abort)."""
        if not self.generating:  # the engine made it all: its client, slow to read, gets it
            return False
        first = self.abort_cause is None
        if first:
            self.abort_cause = cause
        self.scope.cancel()
        if self.stream is not None:  # the engine stops now: its reader may be held in a
            self.stream.close()  # write to a client that stopped reading (shielded)
        return first

    def on_delta(self, delta: Delta) -> None:
        tokens = len(delta.output_ids)
        if not tokens or not self.counted:
            return
        now = time.monotonic()
        metrics = self.front.metrics
        if self.first_token_at is None:
            self.first_token_at = now
            self._observe(metrics.ttft, now - self.arrived)
        last = self._last.get(delta.index)
        if last is None:  # a sequence's first chunk: its first token ends no gap,
            gaps, gap = tokens - 1, 0.0  # and the others came with it
        else:  # a chunk of k tokens: k gaps of its mean
            gaps, gap = tokens, (now - last) / tokens
        for _ in range(gaps):
            self._observe(metrics.itl, gap)
        self._last[delta.index] = now

    def _observe(self, histogram: Histogram, value: float) -> None:
        if self.deferred is None:
            histogram.observe(value)
        else:
            self.deferred.append((histogram, value))


@dataclass
class Waiting:
    """A prompt of a request, not started yet (see Front.pending)."""

    batch: str | None
    aborted: str | None = None  # the cause, once aborted


class Turns:
    """The prompts of one request that wait for their turn to start."""

    def __init__(self, front: Front) -> None:
        self._front = front
        self.waiting: dict[str, Waiting] = {}

    def started(self, rid: str) -> str | None:
        """Prompt ``rid`` starts (it is no longer pending); the cause, if it was aborted."""
        waiting = self.waiting.get(rid)
        if waiting is None or self._front._pending.get(rid) is not waiting:
            return None
        del self._front._pending[rid]
        return waiting.aborted


class Admission:
    """The generations one request was admitted for. Each stream's leave the
    count once the engine has ended that stream, not when the client has read
    it: a client that stops reading held its room until --send-timeout cut it,
    and kept others out with 503s while the engine sat idle. A reader frees its
    stream's room at its last chunk; one stuck behind a write is freed by
    :meth:`reclaim`, asked by a request that would be refused (the only time
    the room is wanted)."""

    def __init__(self, front: Front, count: int) -> None:
        self._front = front
        self.left = count
        self._streams: dict[Any, int] = {}  # an EngineStream -> its samples

    def watch(self, stream: Any, samples: int) -> None:
        self._streams[stream] = samples

    def ended(self, stream: Any) -> None:
        """The engine is done with ``stream``: its samples' room is free."""
        self.release(self._streams.pop(stream, 0))

    def reclaim(self) -> None:
        for stream in [s for s in self._streams if s.ended]:
            self.ended(stream)

    def release(self, count: int) -> None:
        count = min(count, self.left)
        self.left -= count
        self._front.admitted -= count


class Front:
    def __init__(self, engine: Any, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.started_at = time.time()
        self.metrics = Metrics(self.state)
        self.tokens = TokenTexts(engine.options.resolved_tokenizer_path())
        self.encoder = Encoder(engine.options.resolved_tokenizer_path())  # /tokenize's
        self.in_flight: dict[str, Tracked] = {}
        self._pending: dict[str, Waiting] = {}  # prompts' rids, not started yet
        self.admitted = 0
        self._admissions: set[Admission] = set()
        self.scheduler: SchedulerStats | None = None
        self.retractions_before = 0  # those of the scheduler's earlier incarnations
        self.max_connections: int | None = None  # the cap in effect, once serving (0: none)
        options = engine.options
        queued = settings.max_queued_requests
        self.limit = None if queued is None else options.max_running_requests + queued
        self.context_length, self.vocab_size = options.model_limits()
        self.eos_ids = _eos_ids(options.resolved_model_path())  # (for stop_reason)
        self._parsing = trio.Lock()  # (a big body's turn to parse)
        self._parse_free_at = 0.0  # (and when it may start)

    async def parse(self, model: type[M], body: bytes) -> M:
        """``body`` as ``model`` (or a 400: ``rt.http.schemas.parse``), in its turn."""
        async with self.turn(len(body)):
            return parse(model, body)

    @asynccontextmanager
    async def turn(self, size: int) -> AsyncIterator[None]:
        """The turn of a body (or a WebSocket frame) of ``size`` bytes to be parsed:
        a big one waits for the others before it, so that other requests are served
        between."""
        if size < BIG_BODY:
            yield
            return
        async with self._parsing:
            await trio.sleep_until(self._parse_free_at)  # (the loop's other half)
            start = trio.current_time()
            try:
                yield
            finally:
                now = trio.current_time()
                self._parse_free_at = now + (now - start)

    # ---- admission ---------------------------------------------------------------

    @contextmanager
    def admit(self, count: int) -> Iterator[Admission]:
        """Room for ``count`` more generations, or 503 with Retry-After (a 400 for
        more than the server ever holds: retrying could not help). They leave as
        the engine ends them (:meth:`Admission.release`), or all at the end."""
        if self.limit is not None and count > self.limit:
            raise HTTPError(
                400,
                f"the request asks for {count} generations (prompts × n), more than the "
                f"server ever holds ({self.limit}: --max-running-requests + "
                "--max-queued-requests); send fewer at a time",
            )
        if self.limit is not None and self.admitted + count > self.limit:
            for admission in list(self._admissions):  # the ended, whose clients lag
                admission.reclaim()
        if self.limit is not None and self.admitted + count > self.limit:
            self.metrics.rejected.inc()
            raise HTTPError(
                503,
                f"the server is at its queue limit ({self.limit} generations in flight: "
                "--max-running-requests + --max-queued-requests); retry later",
                code="overloaded",
                headers=[("retry-after", str(self.settings.retry_after_s))],
            )
        self.admitted += count
        admission = Admission(self, count)
        self._admissions.add(admission)
        try:
            yield admission
        finally:
            self._admissions.discard(admission)
            admission.release(admission.left)

    @contextmanager
    def pending(self, rids: list[tuple[str, str | None]]) -> Iterator[Turns]:
        """The rids of a request's prompts (each with its batch's), known before they
        start (a batch starts them a few at a time): abortable and taken from the
        start, as if in flight. Each prompt says it starts through the Turns."""
        turns = Turns(self)
        try:
            for rid, batch in rids:
                if rid in self.in_flight or rid in self._pending:
                    self._in_use(rid)
                self._pending[rid] = turns.waiting[rid] = Waiting(batch)
            yield turns
        finally:
            for rid, waiting in turns.waiting.items():  # (those still its own)
                if self._pending.get(rid) is waiting:
                    del self._pending[rid]

    def _in_use(self, rid: str) -> None:
        raise HTTPError(
            400,
            f"rid: {rid!r} is already in flight; a rid can be used again once its "
            "request has finished",
            param="rid",
        )

    @contextmanager
    def track(
        self, rid: str, batch: str | None = None, counted: bool = True, defer: bool = False
    ) -> Iterator[Tracked]:
        if rid in self.in_flight or rid in self._pending:
            self._in_use(rid)
        tracked = Tracked(self, rid, batch, counted, defer)
        self.in_flight[rid] = tracked
        try:
            yield tracked
        finally:
            del self.in_flight[rid]
            if tracked.abort_cause is not None and tracked.counted:
                self.metrics.aborted.labels(tracked.abort_cause).inc()

    def abort(self, rid: str) -> int:
        """Abort ``rid``, and each prompt of a batch whose rid it is (their rids are
        ``rid-0``, ``rid-1``, …; a request whose client chose such a rid is no
        batch's). A batch may have the rid of a single request in flight: both
        are aborted (the batch ran on). Returns how many."""
        found = [t for r, t in self.in_flight.items() if r == rid or t.batch == rid]
        waiting = [w for r, w in self._pending.items() if r == rid or w.batch == rid]
        if not found and not waiting:  # the Python API's, on a served engine
            return self._abort_others({rid}, "abort_request")
        return sum(each.abort("abort_request") for each in found) + sum(
            _abort_waiting(one, "abort_request")
            for one in waiting  # (ended as they start)
        )

    def abort_all(self, cause: str = "abort_request") -> int:
        """Abort every request in flight: the HTTP ones, their prompts still waiting
        for their turn, and those of the engine's other callers (the Python API's,
        on a server made by ``rt.http.serve(engine)``). Returns how many."""
        aborted = sum(tracked.abort(cause) for tracked in list(self.in_flight.values()))
        aborted += sum(_abort_waiting(waiting, cause) for waiting in self._pending.values())
        return aborted + self._abort_others(self.engine.rids - self.in_flight.keys(), cause)

    def _abort_others(self, rids: set[str], cause: str) -> int:
        """Abort the engine's requests of ``rids`` that no HTTP request tracks (the
        Python API's); counted under ``cause``. Returns how many."""
        aborted = sum(self.engine.abort(rid) for rid in rids)
        if aborted:
            self.metrics.aborted.labels(cause).inc(aborted)
        return aborted

    # ---- the engine's state ---------------------------------------------------------

    def state(self) -> EngineState:
        generating = [t for t in self.in_flight.values() if t.generating]
        waiting = sum(1 for t in generating if t.first_token_at is None)
        return EngineState(
            running=len(generating) - waiting,
            waiting=waiting,
            scheduler=self.scheduler,
            retractions=self.retractions_before
            + (0 if self.scheduler is None else self.scheduler.retractions),
            actors=self.engine.actors(),
        )

    async def watch_scheduler(self) -> None:
        """Keep the scheduler's latest report (for /server_info and /metrics)."""
        while True:
            stats = await self.engine.scheduler_stats(self._is_new)
            last = self.scheduler
            if last is not None and (
                stats.steps < last.steps or stats.retractions < last.retractions
            ):  # a new incarnation counts from 0
                self.retractions_before += last.retractions
            self.scheduler = stats

    def _is_new(self, stats: SchedulerStats) -> bool:
        return stats is not self.scheduler

    @property
    def stopping(self) -> bool:
        """A signal's stop, or the engine giving up (an escalation)."""
        if getattr(self.engine, "stopped_by", None) is not None:
            return True
        return self.engine.supervisor.status().escalated is not None

    def unhealthy(self) -> str | None:
        """Why a request could not complete now, or None (rt.frontend.health)."""
        return unhealthy(self.engine)


def http_error(err: errors.RtError, rename: dict[str, str] | None = None) -> HTTPError:
    """The HTTP answer for an error the engine raised. ``rename`` maps the
    engine's parameter names to the endpoint's (``max_new_tokens`` →
    ``max_tokens``), so that the message names the field the client sent."""
    message = str(err)
    if isinstance(err, errors.InvalidRequestError):
        param = _param(message)
        if rename and param is not None and param.split("[")[0] in rename:
            name = param.split("[")[0]
            param = rename[name] + param[len(name) :]
            message = rename[name] + message[len(name) :]
        return HTTPError(400, message, param=param)
    if isinstance(err, errors.ContextOverflowError):
        # the field the message names, if any ("max_new_tokens is 600" → max_tokens): not
        # max_new_tokens when the budget was the context's room (the body gave none)
        asked = next((n for n in ("min_new_tokens", "max_new_tokens") if n in message), None)
        for name in ("max_new_tokens", "min_new_tokens"):
            if rename and name in rename:
                message = re.sub(rf"\b{name}\b", rename[name], message)
        # (the OpenAI endpoints, whose max_tokens or max_completion_tokens it is, take it)
        per_request = (rename or {}).get("max_new_tokens", "").startswith("max_")
        message = message.replace(
            "set allow_auto_truncate",
            "start the server with --allow-auto-truncate"
            + (" (or send truncate_prompt_tokens)" if per_request else ""),
        )
        # else the prompt's field, as the endpoint names it (OpenAI's chat: "messages")
        # (a field the endpoint does not rename is a list's: in_batch names its place)
        param = (rename or {}).get(asked, asked) if asked else (rename or {}).get(PROMPT)
        return HTTPError(400, message, param=param, code="context_length_exceeded")
    if isinstance(err, errors.RequestTooLargeError):
        return HTTPError(413, message)
    if isinstance(err, errors.ServiceUnavailableError):
        return HTTPError(503, message, headers=[("retry-after", "1")])
    if isinstance(err, errors.EngineShutdownError):
        return HTTPError(503, f"the server is shutting down: {message}", code="shutting_down")
    if isinstance(err, errors.RequestFailedError):
        return HTTPError(500, message, code="request_failed")
    return HTTPError(500, f"{type(err).__name__}: {message}")


PROMPT = "<prompt>"  # in a ``rename``: the field that holds the prompt


def _param(message: str) -> str | None:
    """The field an engine message starts with (``temperature: expected ...``)."""
    head, sep, _ = message.partition(":")
    if sep and head and " " not in head:
        return head
    return None


def _eos_ids(model_path: str) -> frozenset[int]:
    """The model's end-of-text ids (generation_config.json's, config.json's, the
    tokenizer's: as the scheduler stops at them, rt.gpu.model_dir)."""
    try:
        return frozenset(read_model_dir(model_path).eos_token_ids)
    except errors.RtError:  # (the engine that read it first said why, if it could not)
        return frozenset()


def _abort_waiting(waiting: Waiting, cause: str) -> bool:
    """Abort a prompt still waiting for its turn; whether it was not aborted already."""
    first = waiting.aborted is None
    waiting.aborted = waiting.aborted or cause
    return first

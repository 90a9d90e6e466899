"""Running generations for an endpoint: one engine stream per prompt, all at
once, each tracked by the front (admission, abort by rid, metrics).

Every endpoint goes through :func:`run`: a streaming endpoint passes
``on_delta`` and sends each delta as it comes; the others read the results.
An aborted request (``/abort_request``, a WebSocket cancel) ends with what it
had, marked ``aborted``; the client leaving cancels everything at once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
from prometheus_client import Histogram

from rt import errors
from rt.frontend.requests import MAX_RID_CHARS
from rt.gpu.sampling_params import MAX_N
from rt.http.asgi import HTTPError
from rt.http.engine_port import Delta, EngineStream, Prompt, TopLogprobs
from rt.http.front import Admission, Front, Turns, http_error


@dataclass
class Job:
    """One engine request: ``prompt`` (text, ids, or None with ``messages`` in
    ``options``) and the engine's keyword options."""

    prompt: Any
    options: dict[str, Any]
    rid: str
    batch: str | None = None  # the rid of the batch this prompt is one of (rid-0, rid-1, …)
    where: str | None = None  # in a batch, the prompt's place in the body: "text[2]"
    params_where: str | None = None  # its own sampling parameters': "sampling_params[2]"
    # the prompt alone is wanted (scored, echoed): the one token generated is dropped
    prompt_only: bool = False


@dataclass
class Seq:
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[TopLogprobs] = field(default_factory=list)


@dataclass
class Result:
    rid: str
    seqs: list[Seq]
    prompt_tokens: int = 0
    cached_tokens: int = 0
    e2e_latency: float = 0.0  # set at the end
    arrived: float = field(default_factory=time.monotonic)
    aborted: str | None = None  # why, when it was aborted before its end
    prompt: Prompt | None = None  # with prompt logprobs, when asked for
    kept_ids: tuple[int, ...] | None = None  # the prompt the model read, when its start was cut
    input_ids: Any = None  # the prompt's ids the model read (an array), from the first chunk
    counts: bool = False  # its figures go to the metrics (once its run is not refused)
    queue_time: float | None = None  # until the scheduler first admitted it
    sent: bool = False  # a chunk of it went out (a stream): its run is no refusal
    latencies: list[tuple[Histogram, float]] = field(default_factory=list)  # (to observe)

    def elapsed(self) -> float:
        return self.e2e_latency or time.monotonic() - self.arrived

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.output_ids) for s in self.seqs)

    def add(self, delta: Delta) -> Seq:
        seq = self.seqs[delta.index]
        seq.text += delta.text
        seq.output_ids += delta.output_ids
        if delta.logprobs is not None:
            seq.logprobs += delta.logprobs
        if delta.top_logprobs is not None:
            seq.top_logprobs += delta.top_logprobs
        if delta.finish_reason is not None:
            seq.finish_reason, seq.matched_stop = delta.finish_reason, delta.matched_stop
        if delta.prompt is not None:
            self.prompt = delta.prompt
        return seq

    def undo(self, delta: Delta) -> None:
        """Take back what ``add(delta)`` added (its client never had it)."""
        seq = self.seqs[delta.index]
        seq.text = seq.text[: len(seq.text) - len(delta.text)]
        del seq.output_ids[len(seq.output_ids) - len(delta.output_ids) :]
        if delta.logprobs:
            del seq.logprobs[len(seq.logprobs) - len(delta.logprobs) :]
        if delta.top_logprobs:
            del seq.top_logprobs[len(seq.top_logprobs) - len(delta.top_logprobs) :]
        if delta.finish_reason is not None:
            seq.finish_reason = seq.matched_stop = None


OnDelta = Callable[[int, Delta, Result], Awaitable[None]]


# The jobs of one run that may be on their way into the engine at once (sent, not
# yet taken): a batch of 65,536 prompts started a task each at once, and the front's
# loop ran them all before anything else (/health unanswered for 20 s, other clients'
# kept-alive connections timed out). The others wait for a slot, doing nothing.
INTAKE = 512


class Taken:
    """Set once the engine has taken every job's prompt (tokenized, within the
    context), each known by its ids or its first token, or the job has ended
    (aborted before its ids came): a stream of several prompts waits for it
    before its status line, so that one prompt the engine refuses makes a plain
    4xx whichever prompt's first token came first. (A refusal is the job's
    failure, which cancels the others: it is never counted.) A job starts once
    fewer than ``INTAKE`` started before it are not taken yet (``slot``)."""

    def __init__(self, jobs: int) -> None:
        self._left = set(range(jobs))
        self.event = trio.Event()
        self._slots = trio.Semaphore(INTAKE)
        if not self._left:
            self.event.set()

    async def slot(self) -> None:
        """Wait until a job may start (its slot is given back when it is taken)."""
        await self._slots.acquire()

    def one(self, i: int) -> None:
        if i in self._left:
            self._left.discard(i)
            self._slots.release()
            if not self._left:
                self.event.set()


async def _watch_taken(stream: EngineStream, i: int, taken: Taken, scope: trio.CancelScope) -> None:
    with scope:
        if await stream.tokenized():
            taken.one(i)


def check_batch_rid(rid: str, prompts: int | None, name: str = "rid") -> None:
    """A batch's rid (of ``prompts``; None: no batch) with room for what its prompts'
    rids add (``rid-0`` …), each at most MAX_RID_CHARS: the engine's refusal named a
    length the client never sent. ``name``: the body's field for it."""
    room = MAX_RID_CHARS - len(f"-{(prompts or 1) - 1}")
    if prompts is not None and len(rid) > room:
        raise HTTPError(
            400,
            f"{name}: expected at most {room} characters for a batch of {prompts} prompts "
            f"(each prompt's rid adds -i to it, and a rid has at most {MAX_RID_CHARS}), got "
            f"{len(rid)}",
            param=name,
        )


async def run(
    front: Front,
    jobs: list[Job],
    on_delta: OnDelta | None = None,
    rename: dict[str, str] | None = None,
    limited: bool = True,
    taken: Taken | None = None,
    so_far: list[Result | None] | None = None,
    counted: bool = True,
) -> list[Result]:
    """Run every job; the results in the jobs' order. The first error (an
    HTTPError, or the engine's mapped by :func:`http_error` with ``rename``)
    cancels the others and is raised. ``limited``: subject to the queue limit.
    ``taken``: told of each job whose prompt the engine has taken. ``so_far``
    (one item a job): each job's result as it fills, for a caller that cancels
    the run and answers with what there was. ``counted``: its figures go to the
    metrics (not a health probe's)."""
    results: list[Result | None] = [None] * len(jobs) if so_far is None else so_far
    failures: list[HTTPError] = []
    if taken is None and len(jobs) > 1:
        taken = Taken(len(jobs))
    pending = [(job.rid, job.batch) for job in jobs] if len(jobs) > 1 else []
    with (
        front.admit(sum(_samples(job) for job in jobs) if limited else 0) as admission,
        front.pending(pending) as turns,  # (abortable before their turns)
        _counting(front, results, failures),
    ):
        async with trio.open_nursery() as nursery:
            for i, job in enumerate(jobs):
                if taken is not None:
                    await taken.slot()
                nursery.start_soon(
                    _run_one,
                    front,
                    admission,
                    i,
                    job,
                    on_delta,
                    rename,
                    results,
                    failures,
                    nursery,
                    taken,
                    turns,
                    counted,
                )
    if failures:
        try:
            raise failures[0]
        finally:  # (its traceback holds this frame: through the list, a cycle that kept
            failures.clear()  # the request, its body and its prompt till a full collection)
    return [r for r in results if r is not None]


async def _run_one(
    front: Front,
    admission: Admission,
    i: int,
    job: Job,
    on_delta: OnDelta | None,
    rename: dict[str, str] | None,
    results: list[Result | None],
    failures: list[HTTPError],
    nursery: trio.Nursery,
    taken: Taken | None,
    turns: Turns,
    counted: bool,
) -> None:
    n = job.options.get("n", 1)  # not validated yet: the engine refuses a bad one below
    result = results[i] = Result(
        job.rid, [Seq() for _ in range(n if isinstance(n, int) and 0 < n <= MAX_N else 1)]
    )
    try:
        aborted = turns.started(job.rid)  # (aborted while it waited for its turn)
        # (a whole answer's latencies are observed with its counts: none, if refused)
        with front.track(job.rid, job.batch, counted, on_delta is None) as tracked:
            if aborted is not None:
                tracked.abort(aborted)
            stream = tracked.stream = EngineStream(front.engine, job.prompt, job.options)
            admission.watch(stream, _samples(job))
            watching = trio.CancelScope()
            if taken is not None:
                nursery.start_soon(_watch_taken, stream, i, taken, watching)
            counts = False  # whether its figures go to the metrics: not a failure's
            try:
                with tracked.scope:
                    async for delta in stream:
                        if job.prompt_only:
                            delta = _without_output(delta)
                        tracked.on_delta(delta)
                        result.add(delta)
                        if delta.finish_reason and stream.ended:
                            admission.ended(stream)  # its room is free: the engine is done
                        if result.kept_ids is None:
                            result.kept_ids = stream.kept_ids
                        if result.input_ids is None:
                            result.input_ids = stream.input_ids
                        result.prompt_tokens = stream.prompt_tokens
                        result.cached_tokens = stream.cached_tokens
                        if taken is not None:
                            taken.one(i)
                        if on_delta is not None:
                            try:
                                await on_delta(i, delta, result)
                            except trio.Cancelled:  # (an abort, a cancel) before it went out:
                                result.undo(delta)  # the answer says only what the client had
                                raise
                            result.sent = True
                counts = counted
            except trio.Cancelled:  # the client left, or a sibling failed
                counts = counted  # (what it was sent was made; a refused run: _counting)
                # a sibling's failure is no client's abort
                if not failures and (stream.cut or not stream.ended):  # (else all was made)
                    tracked.abort_cause = tracked.abort_cause or "cancelled"
                raise
            finally:
                watching.cancel()
                try:
                    await stream.aclose()
                finally:  # (cut before its first chunk, it has them from the engine's table)
                    result.prompt_tokens = stream.prompt_tokens
                    result.cached_tokens = stream.cached_tokens
                    if result.input_ids is None:
                        result.input_ids = stream.input_ids
                    result.aborted = tracked.abort_cause
                    result.e2e_latency = time.monotonic() - result.arrived
                    result.counts = counts
                    result.queue_time = stream.queue_time
                    result.latencies = tracked.deferred or []
    except (errors.RtError, HTTPError) as err:
        failures.append(
            in_batch(err if isinstance(err, HTTPError) else http_error(err, rename), job)
        )
        nursery.cancel_scope.cancel()
        return
    if taken is not None:  # ended (an abort before its ids came too): nothing to wait for
        taken.one(i)


def _without_output(delta: Delta) -> Delta:
    """``delta`` less its tokens, text and their logprobs (the prompt's it keeps)."""
    return dataclasses.replace(
        delta,
        text="",
        output_ids=(),
        logprobs=None if delta.logprobs is None else (),
        top_logprobs=None if delta.top_logprobs is None else (),
    )


PROMPT_FIELDS = ("prompt", "text", "input_ids")


def in_batch(err: HTTPError, job: Job) -> HTTPError:
    """The error of one prompt of a batch, named where the body has it:
    ``input_ids[2][0]``, ``sampling_params[2].temperature``, ``text[2]`` for
    its length; a field every prompt shares keeps its name."""
    if job.where is None:
        return err
    param = err.param or ""
    base = param.split("[")[0]
    if base in PROMPT_FIELDS:
        name = job.where + param[len(base) :]
    elif err.code == "context_length_exceeded" and not (param and err.message.startswith(param)):
        # the prompt's length at fault: named by its place (not "max_tokens is N, which
        # leaves no room for the prompt", the field alone at fault: it keeps its name)
        name, param = job.where, ""
    elif param and job.params_where is not None:
        name = f"{job.params_where}.{param}"
    else:
        return err
    message = err.message
    message = (
        name + message[len(param) :]
        if param and message.startswith(param)
        else f"{name}: {message}"
    )
    return HTTPError(
        err.status, message, type=err.type, param=name, code=err.code, headers=err.headers
    )


@contextmanager
def _counting(
    front: Front, results: list[Result | None], failures: list[HTTPError]
) -> Iterator[None]:
    """Count the run's results in the metrics as it ends, however it ends (a client
    that left too), but for a run refused: a prompt's failure before any chunk went
    out refuses them all (the answer is an error), one that finished before it too.
    After a stream began, what each was sent is counted, as a client's that left."""
    try:
        yield
    finally:
        if not failures or any(r is not None and r.sent for r in results):
            for result in results:
                if result is not None and result.counts:
                    _count(front, result)


def _count(front: Front, result: Result) -> None:
    metrics = front.metrics
    if result.queue_time is not None:
        metrics.queue_time.observe(result.queue_time)
    for histogram, value in result.latencies:
        histogram.observe(value)
    if result.aborted is None and all(seq.finish_reason is not None for seq in result.seqs):
        metrics.e2e.observe(result.e2e_latency)  # (not one a sibling's failure cut)
    metrics.count_tokens(result.prompt_tokens, result.cached_tokens, result.completion_tokens)
    for seq in result.seqs:
        if seq.finish_reason is not None:
            metrics.finished.labels(seq.finish_reason).inc()


def _samples(job: Job) -> int:
    """The generations ``job`` asks for (its ``n``; a bad one is the engine's to refuse)."""
    n = job.options.get("n", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_N else 1

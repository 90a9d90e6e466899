"""Streaming a generation as server-sent events, shared by /generate and the
OpenAI endpoints: each endpoint says what events a delta makes and what comes
after the last one; this sends them, in order, and ends with ``data: [DONE]``.

The status line waits for the first delta, and with several prompts (a
batch) until the engine has taken each, so that a request the engine refuses
(a prompt over the context, say) is still a plain 4xx. An error after that is
an event ``{"error": {...}}`` before ``[DONE]``. The client leaving
cancels every generation of the request at once.

Each event a delta makes carries ``stepped_at`` (an rt extension, beside the
fields the endpoint's format defines): when the scheduler made its tokens,
as ``time.monotonic()`` of the server's machine, for measuring step → client
on the same host (0.0 for tokens a restarted detokenizer replays).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from rt.groups import made_of
from rt.http.asgi import Exchange, HTTPError, last_word
from rt.http.engine_port import Delta
from rt.http.front import Front
from rt.http.generation import Job, Result, Taken, run

EventsOf = Callable[[int, Delta, Result], list[Any]]
TailOf = Callable[[list[Result]], list[Any]]


async def stream(
    ex: Exchange,
    front: Front,
    jobs: list[Job],
    events_of: EventsOf,
    tail_of: TailOf,
    rename: dict[str, str] | None = None,
) -> None:
    lock = trio.Lock()  # the jobs' tasks take turns on the response
    taken = Taken(len(jobs)) if len(jobs) > 1 else None

    async def on_delta(i: int, delta: Delta, result: Result) -> None:
        if taken is not None and not ex.started:
            await taken.event.wait()
        events = events_of(i, delta, result)
        for event in events:
            if isinstance(event, dict):
                event["stepped_at"] = delta.stepped_at
        if lock.locked():
            await lock.acquire()
        else:  # the common case (one job, or no other at work): no checkpoint to take it
            lock.acquire_nowait()
        try:
            if not ex.started:
                await ex.start_events()
            for event in events:
                await ex.event(event)
        finally:
            lock.release()

    try:
        async with ex.cancel_on_disconnect():
            results = await run(front, jobs, on_delta, rename, taken=taken)
    except HTTPError as err:
        if not ex.started:
            raise
        if not ex.disconnected:
            await ex.event(err.body())
            await ex.end_events()
        return
    except BaseException as err:  # the server stopping under it (the engine gave up): say so
        if made_of(err, trio.Cancelled) and ex.started and not ex.disconnected and front.stopping:
            with last_word():
                reason = front.unhealthy() or "the server is shutting down"
                await ex.event(HTTPError(503, reason).body())
                await ex.end_events()
        raise
    if ex.disconnected:
        return
    if not ex.started:
        await ex.start_events()
    for event in tail_of(results):
        await ex.event(event)
    await ex.end_events()

"""Requests over rt-serve's WebSocket API (``/ws``) through :mod:`rt.client`.

Requests share a few connections (many concurrent requests per connection,
as the API intends); a ``disconnect`` request opens its own and goes away
by closing it. A connection that broke is replaced for later requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from rt.chaos.ledger import FAILED_RETRYABLE
from rt.chaos.transports import End, Sender, Sink, first_sequence, status_state
from rt.chaos.workload import RequestSpec


class WsPool:
    """Up to ``size`` shared connections to ``url``, each owned by a task of the
    pool's nursery (a connection is a nursery of its own: it must be opened and
    closed by one task). Use through :func:`open_ws_pool`."""

    def __init__(self, url: str, size: int, nursery: trio.Nursery) -> None:
        self.url, self.size = url, size
        self._nursery = nursery
        self._clients: list[Any] = []
        self._next = 0
        self._lock = trio.Lock()

    async def client(self) -> Any:
        async with self._lock:
            self._clients = [c for c in self._clients if c._failure is None]
            if len(self._clients) < self.size:
                self._clients.append(await self._nursery.start(self._own))
            self._next = (self._next + 1) % len(self._clients)
            return self._clients[self._next]

    async def _own(self, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        from rt import errors
        from rt.client import connect

        try:
            async with connect(self.url) as client:
                task_status.started(client)
                await trio.sleep_forever()
        except errors.RtError:
            pass  # broken while open: its requests failed; the next one opens another


@asynccontextmanager
async def open_ws_pool(url: str, size: int = 4) -> AsyncIterator[WsPool]:
    async with trio.open_nursery() as nursery:
        yield WsPool(url, size, nursery)
        nursery.cancel_scope.cancel()


def ws_sender(pool: WsPool) -> Sender:
    async def send(spec: RequestSpec, sink: Sink) -> End:
        from rt import errors
        from rt.client import RemoteError, connect

        body = dict(spec.extra["body"]) if spec.hostile == "fuzz" else spec.body()
        try:
            if spec.disconnect:
                async with connect(pool.url) as own:
                    return await _stream(own, body, spec, sink)
            return await _stream(await pool.client(), body, spec, sink)
        except RemoteError as err:
            return End(
                status_state(err.status), sink.ids, sink.text, error=err.message, status=err.status
            )
        except errors.Broken as err:  # the connection went: every request on it failed
            return End(FAILED_RETRYABLE, sink.ids, sink.text, error=f"connection: {err}")

    return send


async def _stream(client: Any, body: dict[str, Any], spec: RequestSpec, sink: Sink) -> End:
    stream = client.stream(**body)
    try:
        async for delta in stream:
            if sink.delta(delta.index, delta.text, list(delta.output_ids)):
                return sink.cancelled()  # leaving: a cancel frame, or the connection closes
    finally:
        await stream.aclose()
    meta = stream.meta_info or {}
    return sink.completed(
        prompt_tokens=meta.get("prompt_tokens"),
        resumed_from=first_sequence(meta.get("resumed_from")),
    )

"""A minimal SSE client: one POST over its own HTTP/1.1 connection (h11 on a trio
socket), its response's ``data:`` lines as they come.

Not httpx: its line iterator is a stack of async generators that cannot all
be closed when a client leaves early (trio then warns as each is collected),
and a chaos client leaves early on purpose. Here leaving closes the socket:
the server sees a real disconnect.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import h11
import trio

CHUNK = 65536


class Response:
    def __init__(self, status: int, conn: h11.Connection, stream: trio.SocketStream) -> None:
        self.status, self._conn, self._stream = status, conn, stream
        self._done = False

    async def body(self) -> bytes:
        out = b""
        while (chunk := await self._next_data()) is not None:
            out += chunk
        return out

    async def _next_data(self) -> bytes | None:
        """The next piece of the body, or None at its end."""
        while not self._done:
            event = self._conn.next_event()
            if event is h11.NEED_DATA:
                self._conn.receive_data(await self._stream.receive_some(CHUNK))
                continue
            if isinstance(event, h11.Data):
                return bytes(event.data)
            self._done = True
        return None

    def lines(self) -> _Lines:
        """Each line of the body (an async iterator that needs no closing)."""
        return _Lines(self)


class _Lines:
    def __init__(self, response: Response) -> None:
        self._r = response
        self._buffer = b""

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        while b"\n" not in self._buffer:
            chunk = await self._r._next_data()
            if chunk is None:
                if self._buffer:
                    line, self._buffer = self._buffer, b""
                    return line.decode()
                raise StopAsyncIteration
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.rstrip(b"\r").decode()


@asynccontextmanager
async def post(url: str, path: str, body: bytes) -> AsyncIterator[Response]:
    """POST ``body`` (JSON) to ``url + path``; the response once its head arrived.
    Leaving the ``async with`` closes the connection."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        headers = [
            ("host", f"{host}:{port}"),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
            ("connection", "close"),
        ]
        request = conn.send(h11.Request(method="POST", target=path, headers=headers))
        await stream.send_all((request or b"") + (conn.send(h11.Data(data=body)) or b"")
                              + (conn.send(h11.EndOfMessage()) or b""))  # fmt: skip
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(CHUNK))
                continue
            if isinstance(event, h11.Response):
                yield Response(event.status_code, conn, stream)
                return
            raise ConnectionError(f"expected an HTTP response, got {event!r}")

"""The ASGI plumbing every handler shares: one HTTP exchange (the body in, a
JSON or SSE response out), the error a handler raises to answer early, and
cancellation when the client goes away.

A client that disconnects is seen through the ASGI receive channel
(``http.disconnect``), not by a failed send: hypercorn ignores sends on a
closed stream. :meth:`Exchange.cancel_on_disconnect` watches for it while
the work runs and cancels the work at once. The final message of a response
is always sent outside that scope: hypercorn delivers ``http.disconnect``
to the app while it closes a finished ``Connection: close`` response (inside
the app's last ``send``), and cancelling that send leaves the socket open
(measured: a client reading to EOF then waits forever; Starlette's
StreamingResponse on hypercorn's trio worker does exactly this).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, MutableMapping
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any

import msgspec
import trio

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = Iterable[tuple[str, str]]

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "internal_error",
    501: "not_implemented_error",
    503: "service_unavailable_error",
}
_json = msgspec.json.Encoder()
DRAIN_LIMIT = (
    1 << 20
)  # bytes of an oversized body read (and dropped) so that the client sees the 413


def encode(obj: Any) -> bytes:
    """JSON; a non-finite float becomes null (a -inf logprob stays valid JSON)."""
    return _json.encode(obj)


class HTTPError(Exception):
    """Raised by a handler to answer with an error in OpenAI's shape:
    ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | int | None = None,
        headers: Headers = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or ERROR_TYPES.get(status, "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = tuple(headers)

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code if self.code is not None else self.status,
            }
        }


LAST_WORD_S = 1.0


@contextmanager
def last_word() -> Iterator[None]:
    """Around a last message to a client as the server stops: shielded from the
    stop's cancellation, at most LAST_WORD_S, and given up if the peer is gone."""
    with trio.move_on_after(LAST_WORD_S) as scope, suppress(Exception):
        scope.shield = True
        yield


class ClientDisconnected(Exception):
    """The client went away before the request could be read: nobody to answer."""


class Exchange:
    """One HTTP request and its response."""

    def __init__(
        self, scope: Scope, receive: Receive, send: Send, body_timeout: float = 60.0
    ) -> None:
        self.scope = scope
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
        }
        self._receive = receive
        self._send = send
        self._body_done = False
        self._body_timeout = body_timeout
        self._body_deadline: float | None = None  # set when the body is first read
        self.started = False  # the response's status line has been sent
        self.status = 0  # its status (0: none was sent)
        self.disconnected = False

    async def _out(self, message: dict[str, Any]) -> None:
        """One message to the server, whole. hypercorn writes to the socket shielded
        from cancellation, but an abort landing between that write and the update of
        its own state left the two apart: the status line sent, its state still
        REQUEST, and the next message broke the connection (an SSE request aborted
        at its first token got no response, and an ERROR was logged)."""
        with trio.CancelScope(shield=True):
            await self._send(message)

    async def read_body(self, limit: int, why: str = "--max-body-size") -> bytes:
        """The whole body; 413 past ``limit`` bytes (``why``: the limit's source), 408
        when it has not all arrived ``body_timeout`` seconds after its reading began
        (a client that sends headers and then nothing would hold its connection for ever)."""
        if self._body_deadline is None:
            self._body_deadline = trio.current_time() + self._body_timeout
        with trio.move_on_at(self._body_deadline):
            return await self._read_body(limit, why)
        self._body_done = True  # what is left is never read: the connection closes
        raise HTTPError(
            408,
            f"the request body did not arrive within {self._body_timeout:g} s (--body-timeout)",
            code="request_timeout",
        )

    async def _read_body(self, limit: int, why: str) -> bytes:
        coding = self.headers.get("content-encoding", "identity").strip().lower()
        if coding != "identity":  # the JSON parser would say it is no JSON: say why
            raise HTTPError(
                415,
                f"Content-Encoding {coding!r} is not supported: send the body uncompressed",
                headers=[("accept-encoding", "identity")],
                code="unsupported_content_encoding",
            )
        declared = self.headers.get("content-length", "")
        too_big = declared.isdigit() and int(declared) > limit
        if too_big and int(declared) > limit + DRAIN_LIMIT:
            # refused before a byte is read (not after waiting out a body that the client
            # may hold back until a "100 Continue"); the connection then closes
            raise HTTPError(
                413,
                f"the request body has {declared} bytes; this server accepts at most "
                f"{limit} ({why})",
                code="body_too_large",
            )
        chunks: list[bytes] = []
        size = 0
        while not self._body_done:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                raise ClientDisconnected(f"{self.method} {self.path}: the client left mid-body")
            chunk = message.get("body", b"")
            size += len(chunk)
            too_big = too_big or size > limit
            if not too_big:
                chunks.append(chunk)
            self._body_done = not message.get("more_body", False)
            if size > limit + DRAIN_LIMIT:
                break
        if too_big:
            raise HTTPError(
                413,
                f"the request body has {declared or f'more than {size}'} bytes; "
                f"this server accepts at most {limit} ({why})",
                code="body_too_large",
            )
        return b"".join(chunks)

    @property
    def body_read(self) -> bool:
        """Whether the request's body has all been read (or had none)."""
        return self._body_done

    async def discard_body(self) -> None:
        """Read what is left of the body (at most DRAIN_LIMIT bytes) so that the
        connection can carry the next request; past that, it closes after the
        response. A client that reuses a connection whose request body the
        server did not read gets it closed under its next request."""
        if not self._body_done:
            try:
                await self.read_body(0)
            except HTTPError:
                pass

    async def respond(
        self, status: int, body: bytes, content_type: str, headers: Headers = ()
    ) -> None:
        raw = [
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        if not self._body_done:  # a body left unread: this connection cannot carry another request
            raw.append((b"connection", b"close"))
        self.started, self.status = True, status
        await self._out({"type": "http.response.start", "status": status, "headers": raw})
        if self.method == "HEAD":  # the length GET's body would have, and no body
            body = b""
        await self._out({"type": "http.response.body", "body": body, "more_body": False})

    async def json(self, obj: Any, status: int = 200, headers: Headers = ()) -> None:
        await self.respond(status, encode(obj), "application/json", headers)

    async def error(self, err: HTTPError) -> None:
        await self.json(err.body(), err.status, err.headers)

    # ---- server-sent events --------------------------------------------------------

    async def start_events(self) -> None:
        self.started, self.status = True, 200
        await self._out(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )

    async def event(self, obj: Any) -> None:
        data = b"data: " + encode(obj) + b"\n\n"
        await self._out({"type": "http.response.body", "body": data, "more_body": True})

    async def end_events(self) -> None:
        """The last event, ``data: [DONE]``, and the end of the response."""
        await self._out(
            {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False}
        )

    # ---- the client going away ---------------------------------------------------------

    @asynccontextmanager
    async def cancel_on_disconnect(self) -> AsyncIterator[trio.CancelScope]:
        """Run the body in a scope that is cancelled as soon as the client
        disconnects (``self.disconnected`` then says so). Read the body first:
        the watcher takes every later message from the receive channel."""
        error: Exception | None = None
        async with trio.open_nursery() as nursery:
            work = trio.CancelScope()
            nursery.start_soon(self._watch, work)
            try:
                with work:
                    yield work
            except Exception as exc:  # raised below, not wrapped in the nursery's group
                error = exc
            finally:
                nursery.cancel_scope.cancel()
        if error is not None:
            raise error

    async def _watch(self, work: trio.CancelScope) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        work.cancel()

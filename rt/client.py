"""A trio client for rt-serve's WebSocket API (``GET /ws``).

Many requests share one connection; each has an ``id`` of the client's own,
and one reader task routes the server's frames to the request they name::

    async with rt.client.connect("ws://127.0.0.1:30000/ws") as client:
        out = await client.generate(text="In the beginning", sampling_params={"max_new_tokens": 8})
        print(out["text"], out["meta_info"]["finish_reason"])
        async for delta in client.stream(text="And God said", sampling_params={"max_new_tokens": 8}):
            print(delta.text, end="")

The body of a request is that of ``POST /generate`` (``text`` or
``input_ids``, ``sampling_params``, ``return_logprob``, ``top_logprobs_num``,
``rid``, …); the server checks it, but for what JSON cannot carry as given
(bytes, NaN or infinity, a lone surrogate, a key not a string, an object of
another type), which
this client refuses before sending, with :class:`rt.errors.InvalidRequestError`
naming the field. Cancelling the task that awaits a request, or leaving a
stream early, sends ``cancel`` for it (a stream kept in a name: from ``async
with client.stream(...) as stream:``, or ``await stream.aclose()``).

Errors: an ``error`` frame raises :class:`RemoteError` (a
:class:`rt.errors.RequestError`, with the frame's ``status`` and ``message``);
a connection the server closed or lost fails every request in flight, and
every later one, with :class:`rt.errors.Broken`, as does a server that answers
no ping within ``ping_timeout`` (stopped, frozen, or its host gone); a client
used after its ``async with`` has exited raises :class:`rt.errors.Closed`.
"""

from __future__ import annotations

import itertools
import logging
import math
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec
import trio
import trio_websocket

from rt import errors
from rt.frontend.chat import json_value
from rt.groups import raise_as_is

__all__ = ["Client", "Delta", "RemoteError", "Stream", "connect", "ws_url"]

log = logging.getLogger(__name__)
MAX_MESSAGE_SIZE = 256 << 20  # a done frame with n sequences of top logprobs can be large
PING_INTERVAL = 20.0  # seconds between pings (as the websockets library's)
PING_TIMEOUT = 20.0  # a server that answers none within this is gone
Frame = dict[str, Any]


class RemoteError(errors.RequestError):
    """The server answered one request with an ``error`` frame; the connection
    and the other requests on it go on. ``status`` is the HTTP status the same
    failure gets from ``POST /generate`` (400 for a bad body, 503 overloaded, …)."""

    def __init__(self, status: int, message: str, frame: Frame | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.frame = frame or {}


@dataclass(frozen=True)
class Delta:
    """What one ``delta`` frame brought: the text and token ids new since the
    last one, of sequence ``index`` (0 unless ``n > 1``); ``finish_reason`` on
    the sequence's last delta. ``frame`` is the whole frame, for fields this
    client does not name (``output_token_logprobs``, …)."""

    text: str
    output_ids: tuple[int, ...]
    index: int = 0
    finish_reason: Any = None
    frame: Frame = field(default_factory=dict, repr=False)


def ws_url(url: str) -> str:
    """``http(s)://host:port`` → ``ws(s)://host:port/ws``; a ws URL is kept as it is."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"expected a ws://, wss://, http:// or https:// URL, got {url!r}")
    path = parts.path if parts.path not in ("", "/") else "/ws"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


class Client:
    """One WebSocket connection to rt-serve. Use through :func:`connect`."""

    def __init__(self, ws: trio_websocket.WebSocketConnection, url: str) -> None:
        self._ws = ws
        self.url = url
        self._ids = itertools.count(1)
        self._pending: dict[str, trio.MemorySendChannel[Frame | errors.RtError]] = {}
        self._outbox_send, self._outbox = trio.open_memory_channel[str](math.inf)
        self._failure: errors.RtError | None = None  # set once: closed by us, or broken

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet done, failed or cancelled."""
        return len(self._pending)

    async def generate(self, text: Any = None, **body: Any) -> Any:
        """Run one request to the end; the response of ``POST /generate``:
        ``{"text", "output_ids", "meta_info"}`` (a list of those, by index, when
        the deltas carry several sequences). ``body`` holds the other fields of
        the ``/generate`` body (``input_ids``, ``sampling_params``, …)."""
        stream = self.stream(text, **body)
        texts: dict[int, list[str]] = {}
        ids: dict[int, list[int]] = {}
        async for delta in stream:
            texts.setdefault(delta.index, []).append(delta.text)
            ids.setdefault(delta.index, []).extend(delta.output_ids)
        meta = stream.meta_info or {}
        metas = stream.meta_infos or []
        outs = [  # (each sequence the done frame tells of: aborted, some have no delta)
            {
                "text": "".join(texts.get(i, ())),
                "output_ids": ids.get(i, []),
                "meta_info": metas[i] if i < len(metas) else meta,
            }
            for i in sorted(set(texts) | set(range(len(metas))))
        ]
        if len(outs) > 1:
            return outs
        return outs[0] if outs else {"text": "", "output_ids": [], "meta_info": meta}

    def stream(self, text: Any = None, **body: Any) -> Stream:
        """``async for delta in client.stream(...)``: the request's deltas as they
        come; ``stream.meta_info`` holds the ``done`` frame's ``meta_info`` after
        (and ``stream.meta_infos`` each sequence's, when ``n > 1``)."""
        if text is not None:
            body["text"] = text
        return Stream(self, body)

    # ---- the connection's side ---------------------------------------------------

    def _open(self, body: Frame) -> tuple[str, trio.MemoryReceiveChannel[Frame | errors.RtError]]:
        if self._failure is not None:
            raise type(self._failure)(str(self._failure))
        fid = str(next(self._ids))  # the frame id, not the body's rid
        # the id first: a frame the server cannot parse whole (over its size limit) is
        # refused for the id it begins with (else for none: the request waited for good)
        fields = {k: v for k, v in body.items() if k not in ("id", "type")}
        message = _encode({"id": fid, "type": "generate", **fields})  # refused: nothing sent
        send, receive = trio.open_memory_channel[Frame | errors.RtError](math.inf)
        self._pending[fid] = send
        self._outbox_send.send_nowait(message)
        return fid, receive

    def _cancel(self, fid: str) -> None:
        send = self._pending.pop(fid, None)
        if send is not None:
            send.close()  # (a task reading it, when another closed the stream, ends)
            if self._failure is None:
                self._post({"id": fid, "type": "cancel"})

    def _post(self, frame: Frame) -> None:
        # One writer task sends every frame: a cancelled caller never interrupts a
        # send halfway, and cancel can be posted from a synchronous close().
        self._outbox_send.send_nowait(_encode(frame))

    async def _write(self) -> None:
        async for message in self._outbox:
            try:
                await self._ws.send_message(message)
            except trio_websocket.ConnectionClosed:
                return  # the reader sees it too, and fails what is in flight

    async def _read(self, max_message_size: int) -> None:
        try:
            while True:
                self._route(await self._ws.get_message())
        except trio_websocket.ConnectionClosed as err:
            reason = err.reason
            said = f"code {reason.code} ({reason.name}) {reason.reason or ''}" if reason else ""
            if reason is not None and reason.code == 1009 and self._failure is None:
                if (reason.reason or "").startswith("Exceeded maximum message size"):  # ours
                    said += (
                        f" (a frame from the server was over this client's max_message_size, "
                        f"{max_message_size} bytes: connect with a larger one)"
                    )
                else:  # the server's
                    said += (
                        " (the server closed it: a frame sent was over its limit, its "
                        "--max-body-size and a little more)"
                    )
            self._fail(
                errors.Broken(
                    f"the WebSocket connection to {self.url} closed: {said.strip()}; "
                    "requests in flight on it are lost, open a new connection to go on"
                )
            )

    async def _keepalive(self, interval: float, timeout: float) -> None:
        """A ping each ``interval``; no pong within ``timeout``: the server is gone
        (stopped, frozen, its host down), which TCP alone tells no one for hours."""
        while self._failure is None:
            await trio.sleep(interval)
            with trio.move_on_after(timeout) as waiting:
                try:
                    await self._ws.ping()
                except trio_websocket.ConnectionClosed:
                    return  # the reader sees it too, and says why
            if waiting.cancelled_caught:
                self._fail(
                    errors.Broken(
                        f"{self.url} answered no ping within {timeout:g} s: the server is "
                        "stopped or frozen, or the network to it is down; requests in flight "
                        "on it are lost, open a new connection to go on"
                    )
                )
                return

    def _route(self, message: str | bytes) -> None:
        try:
            frame = msgspec.json.decode(message)
            fid = frame["id"]
            waiter = self._pending[fid]
        except (msgspec.DecodeError, TypeError, KeyError):
            # Not for a request in flight: one this client cancelled (frames already
            # on their way), or a server bug. Neither concerns the other requests.
            log.debug("dropped a frame no request waits for: %.200r", message)
            return
        waiter.send_nowait(frame)
        if frame.get("type") in ("done", "error"):
            del self._pending[fid]
            waiter.close()

    def _fail(self, error: errors.RtError) -> None:
        if self._failure is None:
            self._failure = error
        self._outbox_send.close()
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            waiter.send_nowait(type(error)(str(error)))  # one instance per request
            waiter.close()


def _encode(frame: Frame) -> str:
    """The frame as JSON text. What JSON cannot carry as given is refused first,
    naming its field, by the check the engine gives every JSON value (string
    keys, finite numbers, 64-bit integers, valid Unicode, bounded nesting):
    msgspec would send bytes as base64 text and NaN as null (the server then ran
    another request than the one asked for), and fail on other types."""
    for key, value in frame.items():
        json_value(key, value, 0, [sys.maxsize])  # (a body's size is the server's to bound)
    return msgspec.json.encode(frame).decode()


class Stream:
    """The deltas of one request, as an async iterator. Leaving it early sends
    ``cancel``: ``async with client.stream(...) as stream:`` (or ``await
    stream.aclose()``) does so at once; an ``async for`` over the call itself,
    as soon as the stream is collected (a ``break`` from a stream kept in a name
    sent nothing, and the server made every token)."""

    def __init__(self, client: Client, body: Frame) -> None:
        self._client = client
        self._body = body
        self._frames: trio.MemoryReceiveChannel[Frame | errors.RtError] | None = None
        self._done = False
        self._closed_unread = False  # closed before it was read: reading it is an error
        self.id: str | None = None  # the frame id, once sent
        self.meta_info: Frame | None = None
        self.meta_infos: list[Frame] | None = None  # each sequence's, when n > 1

    def __aiter__(self) -> Stream:
        return self

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        self.close()
        if exc_type is None:  # (a checkpoint's Cancelled would replace the body's error)
            await trio.lowlevel.checkpoint()

    async def __anext__(self) -> Delta:
        if self._closed_unread:  # (it would read as an empty answer)
            raise errors.Closed("this stream was closed before it was read")
        while not self._done:
            try:
                if self._frames is None:
                    self.id, self._frames = self._client._open(self._body)
                item = await self._frames.receive()
            except trio.EndOfChannel:  # closed by another task: it ends here
                self._done = True
                break
            except BaseException:
                self.close()
                raise
            if isinstance(item, errors.RtError):
                self._done = True
                raise item
            kind = item.get("type")
            if kind == "delta":
                ids = item.get("output_ids") or ()
                return Delta(
                    item.get("text", ""),
                    tuple(ids),
                    item.get("index", 0),
                    item.get("finish_reason"),
                    item,
                )
            if kind in ("done", "error"):
                self._done = True
            if kind == "done":
                self.meta_info = item.get("meta_info", {})
                self.meta_infos = item.get("meta_infos")
            elif kind == "error":
                raise RemoteError(item.get("status", 0), str(item.get("message", "")), item)
            # else: a frame type this client does not know; skip it
        raise StopAsyncIteration

    def close(self) -> None:
        """Stop: send ``cancel`` if the request has not finished."""
        if not self._done:
            self._done, self._closed_unread = True, self._frames is None
            if self.id is not None:
                self._client._cancel(self.id)

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def __del__(self) -> None:
        self.close()


@asynccontextmanager
async def connect(
    url: str,
    *,
    api_key: str | None = None,
    connect_timeout: float = 10.0,
    max_message_size: int = MAX_MESSAGE_SIZE,
    ping_interval: float | None = PING_INTERVAL,
    ping_timeout: float = PING_TIMEOUT,
) -> AsyncIterator[Client]:
    """Open a connection for the body of the ``async with``. ``url`` is the
    server's ``ws://host:port/ws`` (or its ``http://host:port``); ``api_key`` is
    sent as ``Authorization: Bearer``. Leaving the body closes the connection,
    and the server cancels whatever was still in flight on it.

    A frame from the server over ``max_message_size`` bytes ends the connection
    (close code 1009). Every ``ping_interval`` seconds (None: never) the client
    pings; a server that answers none within ``ping_timeout`` is taken for gone.
    A timeout or interval that is not a positive number is a ValueError naming it.

    Raises :class:`rt.errors.Broken` when no connection can be opened within
    ``connect_timeout`` seconds: nothing listening, or a refused handshake (a
    401 for a missing key, a 404 for a wrong path)."""
    for name, value in (
        ("connect_timeout", connect_timeout),
        ("ping_timeout", ping_timeout),
        ("ping_interval", ping_interval),
    ):  # (a negative one was trio's ValueError, 0 a ping loop or every ping missed)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if value is not None and not (number and value > 0):
            raise ValueError(f"{name}: expected a positive number of seconds, got {value!r}")
    target = ws_url(url)
    parts = urlsplit(target)
    host, tls = parts.hostname or "127.0.0.1", parts.scheme == "wss"
    port = parts.port or (443 if tls else 80)
    headers = [(b"authorization", f"Bearer {api_key}".encode())] if api_key else None
    # The stream is ours, not trio-websocket's: its open_websocket leaves the
    # socket open when the server refuses the handshake.
    try:
        with trio.fail_after(connect_timeout):
            if tls:
                stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                    host, port, https_compatible=True
                )
            else:
                stream = await trio.open_tcp_stream(host, port)
    except (OSError, trio.TooSlowError) as err:
        raise errors.Broken(
            f"cannot connect to {target}: {str(err) or f'timed out after {connect_timeout:g} s'}; "
            "is rt-serve listening there?"
        ) from err
    async with stream:
        try:
            async with trio.open_nursery() as nursery:
                with trio.move_on_after(connect_timeout) as handshake:
                    ws = await trio_websocket.wrap_client_stream(
                        nursery,
                        stream,  # type: ignore[arg-type]  # a SocketStream or an SSLStream
                        host if port in (80, 443) else f"{host}:{port}",
                        parts.path + (f"?{parts.query}" if parts.query else ""),
                        extra_headers=headers,
                        max_message_size=max_message_size,
                    )
                if handshake.cancelled_caught:
                    raise errors.Broken(
                        f"{target} did not complete the WebSocket handshake within "
                        f"{connect_timeout:g} s"
                    )
                client = Client(ws, target)
                nursery.start_soon(client._read, max_message_size)
                nursery.start_soon(client._write)
                if ping_interval is not None:
                    nursery.start_soon(client._keepalive, ping_interval, ping_timeout)
                try:
                    yield client
                finally:
                    lost = client._failure is not None  # closed, or answering nothing
                    client._fail(
                        errors.Closed("the client was closed: its `async with` has exited")
                    )
                    if not lost:
                        with trio.move_on_after(connect_timeout):
                            await ws.aclose()  # the close handshake
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # Our own tasks raise nothing, and trio-websocket's reader raises only a
            # refused handshake; anything else in a group of one is the body's own
            # exception: let it out as it was raised.
            if len(group.exceptions) != 1:
                raise
            only = group.exceptions[0]
            if isinstance(only, trio_websocket.ConnectionRejected):
                said = (only.body or b"").decode(errors="replace")[:500]
                raise errors.Broken(
                    f"{target} refused the WebSocket handshake with HTTP {only.status_code}: {said}"
                ) from only
            raise_as_is(only)

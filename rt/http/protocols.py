"""What rt-serve speaks: HTTP/1.1, and WebSocket (RFC 6455) with no extension.

hypercorn also speaks HTTP/2 on a cleartext connection, to a client that opens
with HTTP/2's preface (prior knowledge) or asks ``Upgrade: h2c``, and its
HTTP/2 held up less well than its HTTP/1.1 (hypercorn 0.18, found in review):
an answer whose client closed before taking it waited for its flow-control
window for good, its connection counted open under ``--max-connections`` (N
tiny requests, and every later connection got 503) and a stop took 30 s more;
a client that granted no window had answers held in memory without bound,
its pings keeping ``--send-timeout`` from cutting it; a malformed frame
ended the connection with every request on it. rt offers no TLS, so no ALPN,
and the clients of an LLM server (openai, httpx, curl, browsers over
cleartext) speak HTTP/1.1: the preface gets 505 and the connection is closed;
an ``Upgrade: h2c`` is ignored (RFC 9110 7.8 lets a server), its request
answered in HTTP/1.1.

hypercorn offers permessage-deflate to a WebSocket client that asks, and
wsproto inflates each compressed frame whole, with no bound, before
hypercorn checks the message's size: 1 MiB on the wire took 1.1 GiB of the
server's memory. A malformed offer raised out of the handshake (a traceback,
the connection dropped). The frames rt sends are short JSON deltas, which
compression hardly shortens: no extension is negotiated, an offer is
ignored (RFC 6455 9.1), and a frame the client compresses anyway closes its
connection (1002).

A frame wsproto could not parse (that one, a text frame not in UTF-8, a
control frame too long) ended the connection with no close frame: the
client saw 1006 and not why. It gets the close wsproto names (1002, 1007)
and its reason, as RFC 6455 7.1.7 has an endpoint that fails a connection do.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable

import h11
import hypercorn.protocol
import hypercorn.protocol.h11
import hypercorn.protocol.ws_stream
from hypercorn.events import Closed
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.ws_stream import Handshake
from wsproto import ConnectionType
from wsproto.connection import Connection, ConnectionState
from wsproto.events import CloseConnection, Event

HTTP2_PREFACE = (b"PRI", b"*", b"2.0")  # method, target, version of HTTP/2's first line


class Http2Refused(Exception):
    """The client opened with HTTP/2's preface."""


class Http11(H11Protocol):
    """hypercorn's HTTP/1.1 protocol, which never hands a connection to HTTP/2."""

    async def _check_protocol(self, event: h11.Request) -> None:
        if (event.method, event.target, event.http_version) == HTTP2_PREFACE:
            raise Http2Refused
        # hypercorn upgraded an `Upgrade: h2c` here; the request is served as it came

    async def _handle_events(self) -> None:
        try:
            await super()._handle_events()
        except Http2Refused:
            await self._send_error_response(505)  # HTTP Version Not Supported
            await self.send(Closed())


class NoExtensions(Handshake):
    """A WebSocket handshake that accepts none of the extensions offered, and
    gives the connection a ``FailsWithClose``."""

    def __init__(self, headers: list[tuple[bytes, bytes]], http_version: str) -> None:
        super().__init__(headers, http_version)
        self.extensions = None

    def accept(
        self, subprotocol: str | None, additional_headers: Iterable[tuple[bytes, bytes]]
    ) -> tuple[int, list[tuple[bytes, bytes]], Connection]:
        status, headers, _ = super().accept(subprotocol, additional_headers)
        return status, headers, FailsWithClose(ConnectionType.SERVER)


class FailsWithClose(Connection):
    """wsproto's connection, which has a frame it cannot parse answered with a close.

    wsproto tells of such a frame by a ``CloseConnection`` (its code 1002 or
    1007) while the connection is still open, and hypercorn answers a close
    only in the state a client's close frame leaves: the connection is put
    in that state, and hypercorn answers as it would the client's close."""

    def events(self) -> Generator[Event]:
        for event in super().events():
            if isinstance(event, CloseConnection) and self.state is ConnectionState.OPEN:
                self._state = ConnectionState.REMOTE_CLOSING
            yield event


class ClosesAfterRefusal(hypercorn.protocol.ws_stream.WSStream):
    """hypercorn's WebSocket stream, which lets its connection go once it has
    refused a handshake itself (no key, a version not 13, a frame sent before the
    answer): hypercorn answered 400 ``connection: close`` and never said the
    stream was over, so the connection stayed open for good, holding a
    ``--max-connections`` slot (six such sockets and every client got 503)."""

    async def handle(self, event: StreamEvent) -> None:
        refused_before = self.closed
        await super().handle(event)
        if self.closed and not refused_before and not isinstance(event, StreamClosed):
            await self.send(StreamClosed(stream_id=self.stream_id))


def install() -> None:
    """Have hypercorn use these: its ProtocolWrapper builds ``H11Protocol`` for a
    cleartext connection, which builds a ``WSStream`` for a WebSocket, which
    builds a ``Handshake``, each looked up in its module when used."""
    hypercorn.protocol.H11Protocol = Http11  # type: ignore[misc]
    hypercorn.protocol.ws_stream.Handshake = NoExtensions  # type: ignore[misc]
    hypercorn.protocol.h11.WSStream = ClosesAfterRefusal  # type: ignore[misc]

"""Writes to a client that does not read: watched, and cut when stuck.

hypercorn writes to a client shielded from cancellation, with no timeout. A
client that stops reading but keeps its connection (a process stopped or
hung, a frozen browser tab) once held what it had asked for for good: an SSE
stream's generations, or up to ``--ws-max-in-flight`` of a WebSocket's, and
their KV with them. Each write to a client is timed here. Once one has
waited a pass (a second), its connection's progress is read from the kernel
(``tcpi_bytes_acked``: the bytes the client's TCP has taken); a connection
with a write waiting and nothing taken for ``--send-timeout`` seconds is shut
down at the socket: the write fails, hypercorn lets the connection go, and
the handlers see a client that left (its generations are aborted, their KV
freed). A client that reads, however slowly, moves its count and is never
cut, even while one big write (a long non-streamed answer) takes longer.

The kernel's own bound, TCP_USER_TIMEOUT, does not do: measured on Linux 6.18
with a 2 s bound, it also cut a client that read a little every 0.5 s while
the server wrote faster than that.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

import trio

from rt.http.asgi import Scope, Send

log = logging.getLogger(__name__)

Peer = tuple[Any, ...]  # (host, port) of a client's connection
BYTES_ACKED = 120  # offset of tcpi_bytes_acked (u64) in Linux's struct tcp_info (since 4.1)


class SendWatch:
    """``watch(scope, send)`` times each write; ``run(port)`` cuts the connections
    with a write waiting and no progress for ``timeout_s``."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._writing: dict[int, tuple[float, Peer]] = {}  # write → (since, peer)
        self._ids = itertools.count()
        self._acked: dict[Peer, tuple[int | None, float]] = {}  # peer → (count, since)
        self.cut = 0  # connections cut so far

    def watch(self, scope: Scope, send: Send) -> Send:
        peer = scope.get("client")
        if not peer:  # no address (a unix socket): none to cut
            return send
        peer = tuple(peer[:2])
        writing = self._writing

        async def timed(message: Any) -> None:
            key = next(self._ids)
            writing[key] = (trio.current_time(), peer)
            try:
                await send(message)
            finally:
                del writing[key]

        return timed

    async def run(self, port: int) -> None:
        every = min(1.0, self.timeout_s / 4)
        while True:
            await trio.sleep(every)
            cut = self.check(port, trio.current_time(), every)
            if cut:
                self.cut += cut
                log.warning(
                    "%d client(s) took nothing of a write for %g s (--send-timeout): "
                    "cut, their requests aborted",
                    cut,
                    self.timeout_s,
                )

    def check(self, port: int, now: float, every: float) -> int:
        """One pass: the connections it cut."""
        waiting = {peer for since, peer in self._writing.values() if since <= now - every}
        for peer in [p for p in self._acked if p not in waiting]:
            del self._acked[peer]  # written, or gone
        if not waiting:
            return 0
        cut = 0
        for peer, sock in connections(port, waiting):
            acked = bytes_acked(sock)
            count, since = self._acked.get(peer, (-1, now))
            if count != acked:
                self._acked[peer] = (acked, now)  # first seen waiting, or it moved
            elif now - since >= self.timeout_s:
                del self._acked[peer]
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                    cut += 1
                except OSError:  # gone meanwhile
                    continue
        return cut


def bytes_acked(sock: socket.socket) -> int | None:
    """The bytes of the connection's output its peer has acknowledged (None where
    the kernel does not say: then the wait alone decides)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, BYTES_ACKED + 8)
    except OSError:
        return None
    return struct.unpack_from("Q", info, BYTES_ACKED)[0] if len(info) >= BYTES_ACKED + 8 else None


def connections(port: int, peers: set[Peer] | None = None) -> Iterator[tuple[Peer, socket.socket]]:
    """This process's TCP connections accepted on ``port`` (read from
    /proc/self/fd: hypercorn does not hand out its sockets), those to ``peers``
    alone when given: each peer with a duplicate of its socket, valid until the
    next."""
    for name in os.listdir("/proc/self/fd"):
        try:
            dup = os.dup(int(name))
        except (ValueError, OSError):
            continue
        try:
            sock = socket.socket(fileno=dup)
        except OSError:  # not a socket
            os.close(dup)
            continue
        with sock:  # the duplicate; the connection is the same
            try:
                if (
                    sock.type != socket.SOCK_STREAM
                    or sock.family not in (socket.AF_INET, socket.AF_INET6)
                    or sock.getsockname()[1] != port
                ):
                    continue
                peer = tuple(sock.getpeername()[:2])  # a connection, not the listener (ENOTCONN)
            except OSError:
                continue
            if peers is None or peer in peers:
                yield peer, sock


def cut_connections(port: int) -> int:
    """Shut down every TCP connection of this process accepted on ``port``;
    returns how many."""
    cut = 0
    for _, sock in connections(port):
        try:
            sock.shutdown(socket.SHUT_RDWR)
            cut += 1
        except OSError:
            continue
    return cut

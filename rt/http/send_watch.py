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
cut, even while one big write (a long non-streamed answer) takes longer; the
floor is about one MSS per timeout (the receiver's TCP reopens its window in
segments: 64 KB on loopback, ~1.4 KB on Ethernet).

The kernel's own bound, TCP_USER_TIMEOUT, does not do: measured on Linux 6.18
with a 2 s bound, it also cut a client that read a little every 0.5 s while
the server wrote faster than that.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import trio

from rt.http.asgi import Scope, Send

log = logging.getLogger(__name__)

Peer = tuple[Any, ...]  # (host, port) of a client's connection
BYTES_ACKED = 120  # offset of tcpi_bytes_acked (u64) in Linux's struct tcp_info (since 4.1)
FAILURE_LOG_EVERY_S = 10.0


class SendWatch:
    """``watch(scope, send)`` times each write; ``run(port)`` cuts the connections
    with a write waiting and no progress for ``timeout_s``.

    A waiting connection's socket is found once, by a scan of /proc/self/fd,
    and its fd kept while it waits (checked to be the same connection at each
    pass). Sockets are borrowed, never duplicated, and a spare fd is kept for
    the scan: a server out of fds (every one of them a client's, maybe one of
    them stuck) is when cutting matters most."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._writing: dict[int, tuple[float, Peer]] = {}  # write → (since, peer)
        self._ids = itertools.count()
        self._acked: dict[Peer, tuple[int | None, float]] = {}  # peer → (count, since)
        self._fds: dict[Peer, int] = {}  # a waiting peer's connection
        self._spare = Spare()
        self._failed_at = -float("inf")  # when a pass that failed was last said
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
        self._spare.take()  # (given back by close(), after the stop's cut_all)
        while True:
            await trio.sleep(every)
            try:
                cut = self.check(port, trio.current_time(), every)
            except OSError as err:  # (out of fds even with the spare): the next pass
                if time.monotonic() - self._failed_at >= FAILURE_LOG_EVERY_S:
                    self._failed_at = time.monotonic()
                    log.warning("cannot look at clients' connections: %s", err)
                continue
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
        for known in (self._acked, self._fds):
            for peer in [p for p in known if p not in waiting]:
                del known[peer]  # written, or gone
        if not waiting:
            return 0
        if not waiting <= self._fds.keys():
            with self._spare.freed():
                self._fds.update(connection_fds(port, waiting - self._fds.keys()))
        cut = 0
        for peer, fd in list(self._fds.items()):
            with borrowed(fd) as sock:
                if sock is None or connection_peer(sock, port) != peer:
                    del self._fds[peer]  # closed (its fd maybe another's now): found again
                    continue
                acked = bytes_acked(sock)
                count, since = self._acked.get(peer, (-1, now))
                if count != acked:
                    self._acked[peer] = (acked, now)  # first seen waiting, or it moved
                elif now - since >= self.timeout_s:
                    del self._acked[peer], self._fds[peer]
                    cut += shut_down(sock)
        return cut

    def cut_all(self, port: int) -> int:
        """Shut down every TCP connection of this process accepted on ``port``;
        returns how many."""
        with self._spare.freed():
            fds = connection_fds(port)
        cut = 0
        for fd in fds.values():
            with borrowed(fd) as sock:
                if sock is not None:
                    cut += shut_down(sock)
        return cut

    def close(self) -> None:
        """Give back the spare fd (after the stop)."""
        self._spare.close()


class Spare:
    """One fd held in reserve (/dev/null), let go while a scan needs one."""

    def __init__(self) -> None:
        self._fd: int | None = None

    def take(self) -> None:
        if self._fd is None:
            try:
                self._fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._fd = None  # out of fds already: taken again after the next scan

    @contextlib.contextmanager
    def freed(self) -> Iterator[None]:
        """Let the spare go for the body (taken again after, if one was held)."""
        held = self._fd is not None
        self.close()
        try:
            yield
        finally:
            if held:
                self.take()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@contextlib.contextmanager
def borrowed(fd: int) -> Iterator[socket.socket | None]:
    """The socket at ``fd`` (None if it is none), without a duplicate: it needs no
    fd of its own, and is let go, not closed, after."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:  # closed, or not a socket
        yield None
        return
    try:
        yield sock
    finally:
        sock.detach()


def shut_down(sock: socket.socket) -> int:
    """1 if the connection was shut down here, 0 if it was gone already."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        return 0
    return 1


def bytes_acked(sock: socket.socket) -> int | None:
    """The bytes of the connection's output its peer has acknowledged (None where
    the kernel does not say: then the wait alone decides)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, BYTES_ACKED + 8)
    except OSError:
        return None
    return struct.unpack_from("Q", info, BYTES_ACKED)[0] if len(info) >= BYTES_ACKED + 8 else None


def connection_peer(sock: socket.socket, port: int) -> Peer | None:
    """The client's address if ``sock`` is a TCP connection accepted on ``port``."""
    try:
        if (
            sock.type != socket.SOCK_STREAM
            or sock.family not in (socket.AF_INET, socket.AF_INET6)
            or sock.getsockname()[1] != port
        ):
            return None
        return tuple(sock.getpeername()[:2])  # a connection, not the listener (ENOTCONN)
    except OSError:
        return None


def connection_fds(port: int, peers: set[Peer] | None = None) -> dict[Peer, int]:
    """This process's TCP connections accepted on ``port``, by client address
    (read from /proc/self/fd: hypercorn does not hand out its sockets); those to
    ``peers`` alone when given. The listing itself takes an fd."""
    found: dict[Peer, int] = {}
    for name in os.listdir("/proc/self/fd"):
        with borrowed(int(name)) as sock:
            peer = None if sock is None else connection_peer(sock, port)
        if peer is not None and (peers is None or peer in peers):
            found[peer] = int(name)
    return found

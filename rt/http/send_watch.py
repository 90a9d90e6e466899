"""Writes to a client that does not read: timed, and cut when stuck.

hypercorn writes to a client shielded from cancellation, with no timeout. A
client that stops reading but keeps its connection (a process stopped or
hung, a frozen browser tab) once held what it had asked for for good: an SSE
stream's generation, or up to ``--ws-max-in-flight`` of a WebSocket's, and
their KV with them. Each write to a client is timed here; one not finished
after ``--send-timeout`` seconds gets its connection shut down at the socket:
the write fails, hypercorn lets the connection go, and the handlers see a
client that left (its generations are aborted, their KV freed). A client that
reads, however slowly, lets each write finish.

The kernel's own bound, TCP_USER_TIMEOUT, does not do: measured on Linux 6.18
with a 2 s bound, it also cut a client that read a little every 0.5 s while
the server wrote faster than that.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
from typing import Any

import trio

from rt.http.asgi import Scope, Send

log = logging.getLogger(__name__)


class SendWatch:
    """``watch(scope, send)`` times each write; ``run(port)`` cuts the connections
    whose write has waited over ``timeout_s``."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._writing: dict[int, tuple[float, tuple[Any, ...]]] = {}  # write → (since, peer)
        self._ids = itertools.count()
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
            since = trio.current_time() - self.timeout_s
            stuck = {peer for started, peer in self._writing.values() if started <= since}
            if stuck:
                cut = cut_connections(port, stuck)
                self.cut += cut
                log.warning(
                    "%d client(s) left a write unread for %g s (--send-timeout): "
                    "cut, their requests aborted",
                    cut,
                    self.timeout_s,
                )


def cut_connections(port: int, peers: set[tuple[Any, ...]] | None = None) -> int:
    """Shut down the TCP connections of this process accepted on ``port`` (read
    from /proc/self/fd: hypercorn does not hand out its sockets), those to
    ``peers`` (host, port) alone when given; returns how many."""
    cut = 0
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
                    sock.type == socket.SOCK_STREAM
                    and sock.family in (socket.AF_INET, socket.AF_INET6)
                    and sock.getsockname()[1] == port
                ):
                    peer = sock.getpeername()  # a connection, not the listener (ENOTCONN)
                    if peers is None or tuple(peer[:2]) in peers:
                        sock.shutdown(socket.SHUT_RDWR)
                        cut += 1
            except OSError:
                continue
    return cut

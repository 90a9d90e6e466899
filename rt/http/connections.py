"""The cap on open connections (``--max-connections``).

Each connection holds a file descriptor of the server's process, and a client
may open as many as it likes: past the process's limit of open files, new
connections wait in the kernel's backlog until they time out, and an actor's
restart cannot open what it needs until clients leave (docs/reliability.md).
Past the cap, a new connection is answered at once with a 503 and
``Retry-After``, before its request is parsed, and closed; the process keeps
``FD_SPARE`` descriptors for the engine whatever its clients do. By default
the cap is what the limit of open files leaves once the engine is up, less
that spare and the refusals' (``Gate.fitted``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import socket
from typing import Any

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rt.http.asgi import HTTPError, encode

log = logging.getLogger(__name__)

FD_SPARE = 64  # kept from clients for the engine: an actor's restart, the logs
REFUSING = 64  # refusals that linger at a time (each holds its fd for LINGER_S at most)
LINGER_S = 0.25  # a refused client's request read (and dropped), so that it sees the 503
LINGER_BYTES = 64 << 10
KEEPALIVE_PROBES = 3


def free_fds() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return soft - len(os.listdir("/proc/self/fd"))


class Gate:
    """Counts the open connections; ``most`` 0: no cap. ``lingering``: the
    refusals that may hold their fd for ``LINGER_S`` at once. ``keepalive_s``:
    see ``keep_alive`` (0: the kernel's default, no probes)."""

    def __init__(
        self, most: int, retry_after_s: int, lingering: int = REFUSING, keepalive_s: int = 0
    ) -> None:
        self.most = most
        self.lingering = lingering
        self.keepalive_s = keepalive_s
        self.open = 0
        self.refused = 0
        self._refusing = 0
        error = HTTPError(
            503,
            f"the server has {most} connections open, as many as it takes "
            f"(--max-connections {most}); try again later",
        )
        body = encode(error.body())
        self._answer = (
            "HTTP/1.1 503 Service Unavailable\r\n"
            "content-type: application/json\r\n"
            f"retry-after: {retry_after_s}\r\n"
            "connection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode() + body

    @classmethod
    def fitted(cls, retry_after_s: int, keepalive_s: int = 0) -> Gate:
        """The default: what the limit of open files leaves, less ``FD_SPARE`` for
        the engine and ``REFUSING`` for refusals; on a limit too low for those,
        half of what it leaves, and a quarter for refusals."""
        free = free_fds()
        most = max(free - FD_SPARE - REFUSING, free // 2, 1)
        lingering = min(REFUSING, (free - most) // 2)
        return cls(most, retry_after_s, lingering, keepalive_s)

    def enter(self, sock: Any) -> bool:
        """Count a new connection in (``sock``: its trio socket); False past the
        cap (the caller refuses it)."""
        if self.most and self.open >= self.most:
            self.refused += 1
            if self.refused in (1, 10, 100) or self.refused % 1000 == 0:
                log.warning(
                    "%d connection(s) refused so far: %d open (--max-connections)",
                    self.refused,
                    self.open,
                )
            return False
        self.open += 1
        if self.keepalive_s:
            keep_alive(sock, self.keepalive_s)
        return True

    def leave(self) -> None:
        self.open -= 1

    async def refuse(self, stream: Any) -> None:
        """Answer 503 and close. Closing on bytes not read resets the connection,
        and a client may then lose the answer: the request is read and dropped
        for up to ``LINGER_S``, for ``REFUSING`` refusals at a time; past them,
        only what has come already is, and the answer goes out at once."""
        try:
            if self._refusing < self.lingering:
                await self._linger(stream)
            else:
                self._answer_at_once(stream.socket.fileno())
        finally:
            await trio.aclose_forcefully(stream)

    async def _linger(self, stream: Any) -> None:
        self._refusing += 1
        try:
            with trio.move_on_after(LINGER_S):
                await stream.send_all(self._answer)
                await stream.send_eof()
                dropped = 0
                while dropped < LINGER_BYTES and (data := await stream.receive_some()):
                    dropped += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client left
        finally:
            self._refusing -= 1

    def _answer_at_once(self, fd: int) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: all that came is read
            while os.read(fd, LINGER_BYTES):  # (trio's sockets do not block)
                pass
        with contextlib.suppress(OSError):  # the answer fits an empty send buffer
            os.write(fd, self._answer)

    def register(self, registry: CollectorRegistry) -> None:
        registry.register(_GateCollector(self))


def keep_alive(sock: Any, idle_s: int) -> None:
    """Have the kernel probe the peer of a connection idle for ``idle_s``, and drop
    it when ``KEEPALIVE_PROBES`` probes ``idle_s / 6`` apart go unanswered: a
    client whose host vanished (powered off, a network gone, a NAT that forgot
    it) sends no FIN, and its connection once stayed open for good, a request
    waiting on it (a long answer not streamed) generated to its end, and an idle
    WebSocket held its place under ``--max-connections``."""
    with contextlib.suppress(OSError):  # (a connection already reset)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, idle_s // 6))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)


class _GateCollector(Collector):
    def __init__(self, gate: Gate) -> None:
        self._gate = gate

    def collect(self) -> list[Metric]:
        gate = self._gate
        refused = CounterMetricFamily(
            "rt_http_connections_refused", "Connections refused with 503: past --max-connections"
        )
        refused.add_metric([], gate.refused)
        return [
            GaugeMetricFamily("rt_http_connections", "Open client connections", value=gate.open),
            GaugeMetricFamily(
                "rt_http_max_connections", "--max-connections (0: no cap)", value=gate.most
            ),
            refused,
        ]

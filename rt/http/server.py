"""Serving the app with hypercorn's trio worker, in the caller's trio run.

hypercorn writes to a client shielded from cancellation, with no timeout: a
client that stops reading (its TCP window full) while keeping its connection
open would hold the server past its stop for as long as it liked. Once the
stop has cancelled the server and ``CUT_AFTER_S`` have passed, the
connections still open are shut down at the socket (their writes then fail,
and hypercorn lets them go), so a stop ends within its drain and this grace.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any

import hypercorn.trio.run
import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.trio.tcp_server import TCPServer
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response

from rt.http import protocols
from rt.http.app import App
from rt.http.asgi import HTTPError
from rt.http.connections import Gate
from rt.http.front import Front
from rt.http.send_watch import SendWatch
from rt.http.settings import Settings

log = logging.getLogger(__name__)
# A /ws message over max_body_size gets a 413 error frame, the connection kept; hypercorn
# holds each message whole before the app sees it, so past this much more it closes the
# connection (1009) instead: six half-sent 60 MiB messages once held 355 MB, for good.
WS_FRAME_SLACK = 1 << 20
# Connections the kernel queues before hypercorn accepts them. hypercorn's default, 100,
# overflows when hundreds of clients connect at once (a bench at concurrency 256):
# the rest wait out a SYN retry, a second or more of TTFT. uvicorn's default.
BACKLOG = 2048
CUT_AFTER_S = 2.0  # after the stop's cancellation: the last words (1 s) have been said
ACCEPT_LOG_EVERY_S = 10.0  # a failing accept (out of fds) is logged at most this often


class GatedConfig(Config):
    """hypercorn's configuration, and the cap on open connections that
    ``OneConnection`` keeps (None: no gate, all are taken)."""

    gate: Gate | None = None


def hypercorn_config(settings: Settings, gate: Gate | None = None) -> Config:
    config = GatedConfig()
    config.gate = gate
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    config.bind = [f"{host}:{settings.port}"]
    config.accesslog = None
    config.backlog = BACKLOG
    config.errorlog = logging.getLogger("hypercorn.error")
    config.websocket_max_message_size = settings.max_body_size + WS_FRAME_SLACK
    return config


class Cors(CORSMiddleware):
    """Starlette's CORS, whose refusal of a preflight (an origin, method or header
    not allowed) is rt's JSON error, as every other error is: it was plain text."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        error = HTTPError(400, bytes(response.body).decode("utf-8", "replace"))
        kept = {
            k: v for k, v in response.headers.items() if k not in ("content-type", "content-length")
        }
        return JSONResponse(error.body(), status_code=400, headers=kept)


async def serve(
    engine: Any,
    settings: Settings,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``engine`` over HTTP until cancelled; ``task_status`` gets the bound
    address (``http://127.0.0.1:30000``; port 0 binds a free one)."""
    front = Front(engine, settings)
    sends = SendWatch(settings.send_timeout)
    if settings.max_connections is None:
        gate = Gate.fitted(settings.retry_after_s, keepalive_s=settings.tcp_keepalive)
    else:
        gate = Gate(
            settings.max_connections, settings.retry_after_s, keepalive_s=settings.tcp_keepalive
        )
    gate.register(front.metrics.registry)
    front.max_connections = gate.most
    app: Any = App(front, sends)  # an ASGI 3 callable; hypercorn's types want its TypedDicts
    if settings.allowed_origins:  # preflights answered, and the headers added, by Starlette's
        app = Cors(
            app,
            allow_origins=settings.allowed_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            allow_credentials=settings.allow_credentials,
        )
    done = trio.Event()

    async def run_hypercorn(task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            await hypercorn_serve(app, hypercorn_config(settings, gate), task_status=task_status)
        finally:
            done.set()

    accept_errors = logging.getLogger("trio.serve_listeners")
    quiet = Throttle(ACCEPT_LOG_EVERY_S)
    accept_errors.addFilter(quiet)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(front.watch_scheduler)
            binds = await nursery.start(run_hypercorn)
            port = int(binds[0].rsplit(":", 1)[1])
            front.settings = dataclasses.replace(front.settings, port=port)  # (--port 0's)
            nursery.start_soon(_cut_when_stuck, done, sends, port)
            nursery.start_soon(sends.run, port)
            log.info(
                "taking at most %s connections (--max-connections)", gate.most or "any number of"
            )
            task_status.started(binds[0])
    finally:
        accept_errors.removeFilter(quiet)
        sends.close()


class OneConnection(TCPServer):
    """hypercorn's connection handler, whose failure ends its connection alone,
    and which refuses connections past the cap and sets their keepalive
    (``GatedConfig.gate``).
    hypercorn lets any exception but an OSError out of a connection, through
    the listeners' nursery, and the server with it: a WebSocket client that
    sends its first frame with its handshake (before the 101; hypercorn answers
    400, then fails to send on the broken h11 state) stopped rt-serve, every time
    (hypercorn 0.18, its issue #225)."""

    async def run(self) -> None:
        gate = getattr(self.config, "gate", None)
        if gate is None:
            await self._run()
        elif not gate.enter(self.stream.socket):
            await gate.refuse(self.stream)
        else:
            try:
                await self._run()
            finally:
                gate.leave()

    async def _read_data(self) -> None:
        await super()._read_data()
        # The peer has closed. hypercorn, with no request in progress, kept the
        # connection, and its fd, until its keep-alive timeout: 5 s, in which a
        # client that opened and closed connections held places under the cap.
        # (A request in progress ends as hypercorn has it end; then it closes.)
        await self.idle_task.stop()

    async def _run(self) -> None:
        try:
            await super().run()  # closes the connection on its way out
        except Exception as err:  # an ExceptionGroup too; a trio.Cancelled is no Exception
            while isinstance(err, ExceptionGroup) and len(err.exceptions) == 1:
                err = err.exceptions[0]
            log.warning("a connection failed in hypercorn, and was closed: %r", err)
            log.debug("the connection's failure", exc_info=True)


hypercorn.trio.run.TCPServer = OneConnection  # type: ignore[misc]  # what worker_serve runs
protocols.install()  # HTTP/1.1 and WebSocket with no extension, no HTTP/2


class Throttle(logging.Filter):
    """One record per ``every_s``, without its traceback. trio's accept loop logs
    each failed accept, with a traceback, every 0.1 s while the process is out
    of fds: ~8 KB of log a second for as long as it lasts."""

    def __init__(self, every_s: float) -> None:
        super().__init__()
        self.every_s = every_s
        self._last = -math.inf
        self._hidden = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self._last < self.every_s:
            self._hidden += 1
            return False
        self._last = now
        record.exc_info, record.exc_text = None, None
        if self._hidden:
            record.msg = f"{record.msg} (and {self._hidden} more since the last said)"
            self._hidden = 0
        return True


async def _cut_when_stuck(done: trio.Event, sends: SendWatch, port: int) -> None:
    try:
        await trio.sleep_forever()
    finally:  # the stop: hypercorn has CUT_AFTER_S to let its connections go
        with trio.move_on_after(CUT_AFTER_S, shield=True):
            await done.wait()
        if not done.is_set():
            try:
                cut = sends.cut_all(port)
            except OSError as err:  # out of fds even with the spare
                log.warning("could not cut the connections still open: %s", err)
                return
            log.warning("%d connection(s) still open %g s into the stop: cut", cut, CUT_AFTER_S)

"""Serving the app with hypercorn's trio worker, in the caller's trio run."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from rt.http.app import App
from rt.http.front import Front
from rt.http.settings import Settings

log = logging.getLogger(__name__)
WS_FRAME_LIMIT = 64 << 20  # hypercorn closes past this; the app answers 413 past max_body_size
# Connections the kernel queues before hypercorn accepts them. hypercorn's default, 100,
# overflows when hundreds of clients connect at once (a bench at concurrency 256):
# the rest wait out a SYN retry, a second or more of TTFT. uvicorn's default.
BACKLOG = 2048


def hypercorn_config(settings: Settings) -> Config:
    config = Config()
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    config.bind = [f"{host}:{settings.port}"]
    config.accesslog = None
    config.backlog = BACKLOG
    config.errorlog = logging.getLogger("hypercorn.error")
    config.websocket_max_message_size = max(WS_FRAME_LIMIT, 2 * settings.max_body_size)
    return config


async def serve(
    engine: Any,
    settings: Settings,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``engine`` over HTTP until cancelled; ``task_status`` gets the bound
    address (``http://127.0.0.1:30000``; port 0 binds a free one)."""
    front = Front(engine, settings)
    app: Any = App(front)  # an ASGI 3 callable; hypercorn's types want its TypedDicts
    async with trio.open_nursery() as nursery:
        nursery.start_soon(front.watch_scheduler)
        binds = await nursery.start(partial(hypercorn_serve, app, hypercorn_config(settings)))
        task_status.started(binds[0])

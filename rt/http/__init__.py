"""The HTTP front: an ASGI app over one engine (SGLang's native API, the OpenAI
API, a WebSocket API, health, metrics and admin), served by hypercorn's trio
worker. See docs/architecture.md for this package's role."""

from __future__ import annotations

from rt.http.app import App
from rt.http.front import Front
from rt.http.server import serve
from rt.http.settings import Settings

__all__ = ["App", "Front", "Settings", "serve"]

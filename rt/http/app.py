"""The ASGI app over one engine: routing, the API key, body limits, and errors.

Routing is a dictionary, not a framework. Measured on the SSE path in process,
Starlette adds ~70 µs per request and 1–3 µs per event, FastAPI ~180 µs and
~1.5 µs; over hypercorn the server spends 90–150 µs of CPU per event whichever
is used, so cost did not decide. What did: Starlette's streaming response
cancels hypercorn's close of a finished ``Connection: close`` response (the
client never sees EOF; see rt/http/asgi.py), and every handler here needs
trio's cancellation directly anyway. Validation and the OpenAPI document come
from pydantic (rt/http/schemas.py, rt/http/openapi.py).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rt.http import admin, native, openai_api, openai_chat, tokenize, ws
from rt.http.asgi import (
    DRAIN_LIMIT,
    ClientDisconnected,
    Exchange,
    HTTPError,
    Receive,
    Scope,
    Send,
    last_word,
)
from rt.http.engine_port import answering
from rt.http.front import Front
from rt.http.openapi import document
from rt.http.send_watch import SendWatch

log = logging.getLogger(__name__)
Handler = Callable[..., Awaitable[None]]
MODELS_PREFIX = "/v1/models/"
CONTROL_BODY_LIMIT = 64 << 10  # a control's body ({"mode": "abort"}): nothing near a prompt's


@dataclass(frozen=True)
class Route:
    handler: Handler
    summary: str
    body: bool = False  # POST: the handler gets the body's bytes
    limit: int | None = None  # a body's limit, if under --max-body-size
    open: bool = False  # served without the API key
    safe: bool = True  # a GET that changes nothing: HEAD serves it too (RFC 9110)


ROUTES: dict[tuple[str, str], Route] = {
    ("POST", "/generate"): Route(native.generate, "Generate (SGLang's native API)", body=True),
    ("PUT", "/generate"): Route(native.generate, "Alias of POST /generate (SGLang)", body=True),
    ("POST", "/v1/completions"): Route(openai_api.completions, "OpenAI completions", body=True),
    ("POST", "/v1/chat/completions"): Route(
        openai_chat.chat_completions, "OpenAI chat completions", body=True
    ),
    ("GET", "/v1/models"): Route(openai_api.models, "The served model"),
    ("POST", "/tokenize"): Route(tokenize.tokenize, "Text to token ids", body=True),
    ("POST", "/detokenize"): Route(tokenize.detokenize, "Token ids to text", body=True),
    ("POST", "/v1/tokenize"): Route(tokenize.tokenize, "Alias of /tokenize (SGLang)", body=True),
    ("POST", "/v1/detokenize"): Route(
        tokenize.detokenize, "Alias of /detokenize (SGLang)", body=True
    ),
    ("GET", "/health"): Route(
        admin.health, "200 when every actor runs, generation not paused; 503 and why", open=True
    ),
    ("GET", "/ping"): Route(admin.health, "Alias of /health (vLLM's, SageMaker's)", open=True),
    ("POST", "/ping"): Route(admin.health, "Alias of /health (vLLM's, SageMaker's)", open=True),
    ("GET", "/version"): Route(admin.version, "rt's version"),
    ("GET", "/health_generate"): Route(admin.health_generate, "Generate one token"),
    ("GET", "/server_info"): Route(admin.server_info, "Configuration, model, actors"),
    ("GET", "/get_server_info"): Route(admin.server_info, "Alias of /server_info (SGLang)"),
    ("GET", "/get_model_info"): Route(admin.model_info, "The model's path and kind (SGLang)"),
    ("GET", "/model_info"): Route(admin.model_info, "Alias of /get_model_info (SGLang)"),
    ("GET", "/metrics"): Route(admin.metrics, "Prometheus metrics"),
    ("POST", "/abort_request"): Route(admin.abort_request, "Abort by rid", body=True),
    ("POST", "/flush_cache"): Route(
        admin.flush_cache, "Flush the prefix cache", body=True, limit=CONTROL_BODY_LIMIT
    ),
    ("GET", "/flush_cache"): Route(
        admin.flush_cache, "Flush the prefix cache (SGLang's GET)", safe=False
    ),
    ("POST", "/pause_generation"): Route(
        admin.pause_generation,
        "Pause scheduling; mode abort (the default) aborts what is in flight",
        body=True,
        limit=CONTROL_BODY_LIMIT,
    ),
    ("POST", "/continue_generation"): Route(
        admin.continue_generation, "Resume scheduling", body=True, limit=CONTROL_BODY_LIMIT
    ),
}


class App:
    """``App(front)`` is an ASGI 3 application; with ``sends``, each write to a
    client is timed by it (rt/http/send_watch.py)."""

    def __init__(self, front: Front, sends: SendWatch | None = None) -> None:
        self.front = front
        self._sends = sends
        self._key = front.settings.api_key
        summaries = {key: route.summary for key, route in ROUTES.items()}
        summaries[("GET", "/v1/models/{model}")] = "One model (404 for another id)"
        summaries[("GET", "/ws")] = "WebSocket: many streamed generations per connection"
        summaries[("GET", "/openapi.json")] = "This document"
        self.openapi = document(summaries)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if self._sends is not None and kind != "lifespan":
            send = self._sends.watch(scope, send)
        if kind == "http":
            await self._http(Exchange(scope, receive, send, self.front.settings.body_timeout))
        elif kind == "websocket":
            if scope["path"] != "/ws":
                await receive()
                await send({"type": "websocket.close", "code": 1008, "reason": "no such endpoint"})
                return
            refusal = None if self._authorized(scope) else key_error()
            await ws.websocket(self.front, scope, receive, send, refusal or self._origin(scope))
        elif kind == "lifespan":
            await _lifespan(receive, send)

    def _origin(self, scope: Scope) -> HTTPError | None:
        """A browser page's WebSocket from an origin not in --allowed-origins: 403.
        (CORS does not cover WebSockets: a browser opens one from any page, and
        says from where in ``Origin``; clients that are not browsers send none.)"""
        allowed = self.front.settings.allowed_origins
        origin = next((v for k, v in scope["headers"] if k == b"origin"), None)
        if origin is None or "*" in allowed or origin.decode("latin-1") in allowed:
            return None
        return HTTPError(
            403,
            f"a page from {origin.decode('latin-1')!r} may not open this WebSocket: "
            "the origin is not among the server's --allowed-origins",
        )

    async def _http(self, ex: Exchange) -> None:
        try:
            await self._dispatch(ex)
        except ClientDisconnected:
            return
        except HTTPError as err:
            if not ex.started:
                await ex.discard_body()
                await ex.error(err)
        except Exception:
            log.exception("%s %s failed", ex.method, ex.path)
            if not ex.started:
                await ex.error(HTTPError(500, "internal error; the server log has the traceback"))
        finally:
            if not ex.started and not ex.disconnected and self.front.stopping:
                with last_word():  # cancelled by the stop before it answered: not a drop
                    await ex.error(HTTPError(503, "the server is shutting down"))
            status = "499" if ex.disconnected else str(ex.status)  # 499: the client left
            endpoint = ex.path if ex.path in _KNOWN else "other"
            self.front.metrics.requests.labels(endpoint, status).inc()

    async def _dispatch(self, ex: Exchange) -> None:
        method = "GET" if ex.method == "HEAD" else ex.method  # HEAD: GET's headers alone
        route = ROUTES.get((method, ex.path))
        if route is not None and ex.method == "HEAD" and not route.safe:
            route = None  # (a HEAD must not flush the cache: a 405)
        if route is None:
            await self._other(ex)
            return
        if not route.open:
            self._check_key(ex.scope)
        args: tuple[bytes, ...] = ()
        if route.body:
            most = self.front.settings.max_body_size
            if route.limit is None or route.limit >= most:
                args = (await ex.read_body(most),)
            else:
                args = (await ex.read_body(route.limit, f"{ex.path} takes a small JSON object"),)
        else:
            await ex.discard_body()
            if not ex.body_read:  # refused before it acts (hypercorn may hold an answer to it)
                raise HTTPError(
                    413,
                    f"{ex.path} takes no request body; this one has more than {DRAIN_LIMIT} bytes",
                    code="body_too_large",
                )
        # Only now does a drain wait for it, until its answer is written: a body
        # still arriving is not the engine's (a stalled one held a drain for good).
        with answering(self.front.engine):
            await route.handler(self.front, ex, *args)

    async def _other(self, ex: Exchange) -> None:
        reading = ex.method in ("GET", "HEAD")
        if ex.path.startswith(MODELS_PREFIX) and reading:
            self._check_key(ex.scope)
            await openai_api.models(self.front, ex, ex.path[len(MODELS_PREFIX) :])
        elif ex.path == "/openapi.json" and reading:
            self._check_key(ex.scope)
            await ex.json(self.openapi)
        else:
            allowed = sorted(method for method, path in ROUTES if path == ex.path)
            get = ROUTES.get(("GET", ex.path))
            allowed += ["HEAD"] if get is not None and get.safe else []
            if allowed:
                raise HTTPError(
                    405,
                    f"{ex.path} takes {' or '.join(allowed)}, not {ex.method}",
                    headers=[("allow", ", ".join(allowed))],
                )
            raise HTTPError(404, f"no endpoint {ex.method} {ex.path}; see /openapi.json")

    def _authorized(self, scope: Scope) -> bool:
        if self._key is None:
            return True
        for name, value in scope["headers"]:
            if name.lower() == b"authorization":
                scheme, _, credentials = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(  # any case: RFC 9110
                    credentials, self._key.encode()
                )
        return False

    def _check_key(self, scope: Scope) -> None:
        if not self._authorized(scope):
            raise key_error()


def key_error() -> HTTPError:
    return HTTPError(
        401,
        "missing or wrong API key: send the header 'Authorization: Bearer <key>' "
        "with the key the server was started with (--api-key)",
        code="invalid_api_key",
        headers=[("www-authenticate", "Bearer")],  # RFC 9110: a 401 names its scheme
    )


_KNOWN = {path for _, path in ROUTES} | {"/openapi.json", "/v1/models"}


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message: dict[str, Any] = dict(await receive())
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return

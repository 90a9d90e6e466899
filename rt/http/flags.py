"""rt-serve's flags for the HTTP front (the engine's are in ``rt.serve``), and
the ``Settings`` they make."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from rt import errors
from rt.http.settings import Settings

MAX_KEEPIDLE = 32767  # Linux's most for TCP_KEEPIDLE


def add_server_flags(parser: argparse.ArgumentParser) -> Any:
    """The "server" group of flags; returned, for the caller's own."""
    server = parser.add_argument_group("server")
    server.add_argument(
        "--host", default="127.0.0.1", help="the address to bind (default: %(default)s)"
    )
    server.add_argument(
        "--port",
        type=int,
        default=30000,
        help="the port; 0 picks a free one (default: %(default)s)",
    )
    server.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every endpoint but /health and /ping",
    )
    server.add_argument(
        "--served-model-name",
        default=None,
        help="the model id in /v1/models and responses (default: the model path; 'default' for the shipped model)",
    )
    server.add_argument(
        "--max-queued-requests",
        type=int,
        default=None,
        help="past --max-running-requests plus this many generations in flight, new ones get 503 with Retry-After (default: no limit)",
    )
    server.add_argument(
        "--max-body-size",
        type=int,
        default=Settings.max_body_size,
        help="largest request body or WebSocket frame in bytes; larger gets 413 (default: %(default)s)",
    )
    server.add_argument(
        "--body-timeout",
        type=float,
        default=Settings.body_timeout,
        help="seconds a request body may take to arrive after its headers; then 408 (default: %(default)s)",
    )
    server.add_argument(
        "--send-timeout",
        type=float,
        default=Settings.send_timeout,
        help="seconds a client may take nothing of a write waiting for it (it stopped reading); then its connection is cut and its requests aborted (default: %(default)s)",
    )
    server.add_argument(
        "--ws-max-in-flight",
        type=int,
        default=Settings.ws_max_in_flight,
        help="requests (generate frames, each of up to n samples) one /ws connection may have in flight; one more gets an error frame with status 429 (default: %(default)s)",
    )
    server.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="open client connections taken at once; past them a new one gets 503 with Retry-After, so that clients cannot take the file descriptors the engine needs (0: no cap; default: what the limit of open files leaves once the engine is up, less 64 for the engine and 64 for refusals)",
    )
    server.add_argument(
        "--tcp-keepalive",
        type=int,
        default=Settings.tcp_keepalive,
        help="seconds a client connection may sit idle before the kernel probes its peer; one that answers none of 3 probes is dropped, and its request aborted (a client whose host vanished sends no FIN) (0: no probes; default: %(default)s)",
    )
    server.add_argument(
        "--allowed-origins",
        default='["*"]',
        help="""origins a browser page may call the server from (CORS), as vLLM's flag: a JSON list such as '["https://a.example"]', or "[]" for none (default: '["*"]', any)""",
    )
    server.add_argument(
        "--allow-credentials",
        action="store_true",
        help="let browser pages from --allowed-origins send cookies and credentials (CORS)",
    )
    server.add_argument(
        "--allow-auto-truncate",
        action="store_true",
        help="cut prompts over the context instead of refusing them with 400",
    )
    return server


def http_settings(args: argparse.Namespace) -> Settings:
    if not 0 <= args.port <= 65535:
        raise errors.ConfigError(f"--port: expected a port in [0, 65535], got {args.port}")
    if args.api_key == "":
        raise errors.ConfigError("--api-key: expected a key, got an empty string")
    if args.max_body_size <= 0:
        raise errors.ConfigError(
            f"--max-body-size: expected a positive size, got {args.max_body_size}"
        )
    if not args.body_timeout > 0:
        raise errors.ConfigError(
            f"--body-timeout: expected a positive number of seconds, got {args.body_timeout}"
        )
    if not 0 < args.send_timeout < math.inf:
        raise errors.ConfigError(
            f"--send-timeout: expected a positive number of seconds, got {args.send_timeout}"
        )
    if args.max_queued_requests is not None and args.max_queued_requests < 0:
        raise errors.ConfigError(
            f"--max-queued-requests: expected 0 or more, got {args.max_queued_requests}"
        )
    if args.ws_max_in_flight < 1:
        raise errors.ConfigError(
            f"--ws-max-in-flight: expected 1 or more, got {args.ws_max_in_flight}"
        )
    if args.max_connections is not None and args.max_connections < 0:
        raise errors.ConfigError(
            f"--max-connections: expected 0 or more, got {args.max_connections}"
        )
    if not 0 <= args.tcp_keepalive <= MAX_KEEPIDLE:
        raise errors.ConfigError(
            f"--tcp-keepalive: expected 0 to {MAX_KEEPIDLE} seconds, got {args.tcp_keepalive}"
        )
    origins = _origins(args.allowed_origins)
    return Settings(
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        api_key=args.api_key,
        max_body_size=args.max_body_size,
        body_timeout=args.body_timeout,
        send_timeout=args.send_timeout,
        max_queued_requests=args.max_queued_requests,
        allow_auto_truncate=args.allow_auto_truncate,
        ws_max_in_flight=args.ws_max_in_flight,
        allowed_origins=origins,
        allow_credentials=args.allow_credentials,
        max_connections=args.max_connections,
        tcp_keepalive=args.tcp_keepalive,
    )


def _origins(value: str) -> tuple[str, ...]:
    try:
        origins = json.loads(value)
    except ValueError:
        origins = None
    if not isinstance(origins, list) or not all(isinstance(o, str) and o for o in origins):
        raise errors.ConfigError(
            "--allowed-origins: expected a JSON list of origins such as "
            f"'[\"https://a.example\"]' (or '[\"*\"]', or '[]'), got {value!r}"
        )
    return tuple(origins)

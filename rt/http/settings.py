"""The HTTP front's own settings (the engine's are ``rt.config.EngineOptions``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """``served_model_name``: the model id of /v1/models and of every response
    (None: the model path). ``api_key``: required as ``Authorization: Bearer``
    on every endpoint but /health. ``max_queued_requests``: past
    ``max_running_requests + max_queued_requests`` generations in flight, a new
    one gets 503 with ``Retry-After`` (None: no limit). ``allow_auto_truncate``:
    the default for every request (a prompt over the context is cut instead of
    refused). ``body_timeout``: seconds a request body may take to arrive, from
    its headers (then 408 and the connection closes). ``send_timeout``: seconds
    a client may take nothing of a write waiting for it (it does not read);
    then its connection is cut and its requests aborted. ``ws_max_in_flight``: the
    generations one /ws connection may have in flight (one more is refused
    with an error frame, status 429): a client that sends and never reads
    holds at most that many. ``allowed_origins``: the origins a browser may
    call from (CORS; ``*`` any, as vLLM's and SGLang's servers allow by
    default; none: no CORS headers), with cookies and credentials when
    ``allow_credentials``. ``max_connections``: open connections taken at
    once; past them a new one gets 503 with ``Retry-After`` (None: what the
    limit of open files leaves, ``rt.http.connections.Gate.fitted``; 0: no cap).
    ``tcp_keepalive``: seconds a connection may sit idle before the kernel
    probes its peer (``rt.http.connections.keep_alive``; 0: no probes)."""

    host: str = "127.0.0.1"
    port: int = 30000
    served_model_name: str | None = None
    api_key: str | None = None
    max_body_size: int = 16 << 20
    body_timeout: float = 60.0
    send_timeout: float = 60.0
    max_queued_requests: int | None = None
    retry_after_s: int = 1
    allow_auto_truncate: bool = False
    health_generate_timeout: float = 20.0
    ws_max_in_flight: int = 1024
    allowed_origins: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    max_connections: int | None = None
    tcp_keepalive: int = 60

    def __post_init__(self) -> None:
        assert self.max_body_size > 0, self.max_body_size
        assert self.body_timeout > 0, self.body_timeout
        assert self.send_timeout > 0, self.send_timeout
        assert self.max_queued_requests is None or self.max_queued_requests >= 0
        assert self.ws_max_in_flight >= 1, self.ws_max_in_flight
        assert self.max_connections is None or self.max_connections >= 0
        assert self.tcp_keepalive >= 0, self.tcp_keepalive

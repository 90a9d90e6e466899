"""Sending one request and recording what comes back, per transport.

Each sender takes a :class:`~rt.chaos.workload.RequestSpec` and a
:class:`Sink` (where deltas and anomalies go) and returns the request's
:class:`End`. It cancels when the sink says so (``cancel_after`` deltas):
politely (a cancel frame, ``/abort_request``, leaving the stream) or, for
``disconnect`` requests, by going away (cancelling the task, closing the
connection). :func:`run_request` wraps a sender: it writes ``invoke``, the
deltas and exactly one ``end`` to the ledger, and gives up after
``timeout`` seconds (state ``hung``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import h11
import trio

from rt.chaos.ledger import CANCELLED, COMPLETED, FAILED_FINAL, FAILED_RETRYABLE, HUNG, Ledger
from rt.chaos.workload import RequestSpec

RETRYABLE_ERRORS = ("ServiceUnavailableError", "EngineShutdownError")
RETRYABLE_STATUS = (429, 503)
JSON = {"content-type": "application/json"}


@dataclass
class End:
    state: str
    ids: list[int] = field(default_factory=list)
    text: str = ""
    error: str | None = None
    status: int | None = None
    resumed_from: list[int] | None = None
    prompt_tokens: int | None = None


def error_state(name: str) -> str:
    return FAILED_RETRYABLE if name in RETRYABLE_ERRORS else FAILED_FINAL


def status_state(status: int) -> str:
    return FAILED_RETRYABLE if status in RETRYABLE_STATUS else FAILED_FINAL


class Live(Protocol):
    """What the load knows of requests in flight (for phase conditions)."""

    def started(self, index: int) -> None: ...
    def got(self, index: int, tokens: int) -> None: ...
    def ended(self, index: int) -> None: ...


class Sink:
    """Where a sender reports a request's deltas; says when to cancel."""

    def __init__(self, spec: RequestSpec, ledger: Ledger, live: Live) -> None:
        self.spec, self._ledger, self._live = spec, ledger, live
        self.deltas = 0
        self.ids: list[int] = []
        self.text = ""

    def delta(self, index: int, text: str, ids: list[int]) -> bool:
        """Record one delta; True when the client should cancel now."""
        self._ledger.write("delta", req=self.spec.index, index=index, text=text, ids=ids)
        self.deltas += 1
        if index == 0:
            self.ids += ids
            self.text += text
        self._live.got(self.spec.index, len(ids))
        return self.spec.cancel_after is not None and self.deltas >= self.spec.cancel_after

    def anomaly(self, what: str) -> None:
        self._ledger.write("anomaly", req=self.spec.index, what=what)

    def cancelled(self) -> End:
        return End(CANCELLED, self.ids, self.text)

    def completed(self, **more: Any) -> End:
        return End(COMPLETED, self.ids, self.text, **more)


Sender = Callable[[RequestSpec, Sink], Awaitable[End]]


async def run_request(
    spec: RequestSpec,
    send: Sender,
    ledger: Ledger,
    live: Live,
    timeout: float,
    at_shutdown: bool = False,
) -> End:
    ledger.write("invoke", req=spec.index, spec=asdict(spec))
    live.started(spec.index)
    sink = Sink(spec, ledger, live)
    end: End | None = None
    try:
        with trio.move_on_after(timeout):
            end = await send(spec, sink)
        if end is None:
            end = End(HUNG, sink.ids, sink.text, error=f"no terminal state after {timeout:g} s")
    except Exception as err:  # a sender's bug, or an error rt should not raise
        end = End(FAILED_FINAL, sink.ids, sink.text, error=f"{type(err).__name__}: {err}")
    finally:
        if end is None:  # cancelled from outside: the engine stopped under it
            end = End(HUNG, sink.ids, sink.text, error="the engine stopped before it ended")
        fields = {k: v for k, v in asdict(end).items() if v is not None}
        if at_shutdown:
            fields["at_shutdown"] = True
        ledger.write("end", req=spec.index, **fields)
        live.ended(spec.index)
    return end


# ---- in-process: rt.open_engine -----------------------------------------------------


def engine_sender(engine: Any) -> Sender:
    from rt import errors

    async def send(spec: RequestSpec, sink: Sink) -> End:
        try:
            if spec.stream or spec.cancel_after is not None:
                return await _engine_stream(engine, spec, sink)
            out = await engine.generate(spec.engine_prompt(), **spec.options())
        except errors.RtError as err:
            name = type(err).__name__
            return End(error_state(name), sink.ids, sink.text, error=f"{name}: {err}")
        first = out.choices[0]
        sink.ids, sink.text = list(out.output_ids), out.text
        return sink.completed(
            resumed_from=list(getattr(first, "resumed_from", ()) or ()),
            prompt_tokens=out.meta.prompt_tokens,
        )

    return send


async def _engine_stream(engine: Any, spec: RequestSpec, sink: Sink) -> End:
    with trio.CancelScope() as scope:
        stream = engine.stream(spec.engine_prompt(), **spec.options())
        try:
            async for chunk in stream:
                if sink.delta(chunk.index, chunk.text, list(chunk.output_ids)):
                    if spec.disconnect:
                        scope.cancel()  # the caller goes away: trio cancellation
                        await trio.lowlevel.checkpoint()
                    return sink.cancelled()
        finally:
            await stream.aclose()
    if scope.cancelled_caught:
        return sink.cancelled()
    return sink.completed()


# ---- HTTP: POST /generate, streamed as SSE ------------------------------------------


def sse_sender(http: Any, url: str, run_id: str) -> Sender:
    """``http`` (httpx) for whole answers; streams through :mod:`rt.chaos.sse`."""

    async def send(spec: RequestSpec, sink: Sink) -> End:
        import httpx

        from rt.chaos import sse

        rid = f"chaos-{run_id}-{spec.index}"
        body = spec.extra.get("body") if spec.hostile == "fuzz" else None
        if body is None:
            body = {**spec.body(), "rid": rid}
            body["stream"] = spec.stream or spec.cancel_after is not None
        # json.dumps escapes lone surrogates (a hostile text); httpx's json= cannot
        content = json.dumps(body).encode()
        try:
            if not body.get("stream"):
                response = await http.post(f"{url}/generate", content=content, headers=JSON)
                return _http_end(response.status_code, response.text, sink)
            async with sse.post(url, "/generate", content) as streamed:
                if streamed.status != 200:
                    said = (await streamed.body()).decode(errors="replace")
                    return _http_end(streamed.status, said, sink)
                return await _read_sse(http, url, rid, streamed.lines(), spec, sink)
        except (httpx.HTTPError, OSError, h11.ProtocolError) as err:
            return End(FAILED_RETRYABLE, sink.ids, sink.text, error=f"connection: {err!r}")

    return send


async def _read_sse(
    http: Any, url: str, rid: str, lines: AsyncIterator[str], spec: RequestSpec, sink: Sink
) -> End:
    aborting, lines_seen = False, False
    meta: dict[str, Any] = {}
    async for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        obj = json.loads(data)
        lines_seen = True
        if "error" in obj:
            return _error_event(obj["error"], sink)
        text, ids = obj.get("text", ""), list(obj.get("output_ids", []))
        if not (text.startswith(sink.text) and ids[: len(sink.ids)] == sink.ids):
            sink.anomaly("an SSE event does not extend the one before it")
            continue
        meta = obj.get("meta_info") or {}
        finish = meta.get("finish_reason") or {}
        new_ids, new_text = ids[len(sink.ids) :], text[len(sink.text) :]
        if new_ids or new_text:
            cancel = sink.delta(0, new_text, new_ids)
            if cancel and not aborting:
                if spec.disconnect:
                    return sink.cancelled()  # leaving closes the connection
                aborting = True
                await http.post(f"{url}/abort_request", json={"rid": rid})
        if finish.get("type") == "abort":
            return sink.cancelled()
    if aborting:
        return sink.cancelled()
    # resumed_from: where restarted schedulers took over, when the server says (per sequence)
    resumed = meta.get("resumed_from") if lines_seen else None
    return sink.completed(
        resumed_from=first_sequence(resumed),
        prompt_tokens=meta.get("prompt_tokens") if lines_seen else None,
    )


def first_sequence(resumed: Any) -> list[int] | None:
    """Sequence 0's resume points from a per-sequence list (or a flat one)."""
    if not isinstance(resumed, list):
        return None
    if resumed and isinstance(resumed[0], list):
        return [int(k) for k in resumed[0]]
    return [int(k) for k in resumed]


def _error_event(err: dict[str, Any], sink: Sink) -> End:
    """An SSE error event ends the request: its ``code`` is the HTTP status, or a name."""
    code = err.get("code")
    status = (
        code if isinstance(code, int) else 503 if code in ("shutting_down", "overloaded") else 500
    )
    return End(status_state(status), sink.ids, sink.text, error=err.get("message"), status=status)


def _http_end(status: int, text: str, sink: Sink) -> End:
    if status == 200:
        obj = json.loads(text)
        sink.ids, sink.text = list(obj.get("output_ids", [])), obj.get("text", "")
        meta = obj.get("meta_info") or {}
        return sink.completed(
            prompt_tokens=meta.get("prompt_tokens"),
            resumed_from=first_sequence(meta.get("resumed_from")),
        )
    try:
        message = str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = text
    return End(status_state(status), sink.ids, sink.text, error=message[:300], status=status)

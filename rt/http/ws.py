"""``GET /ws``: many concurrent generations on one WebSocket.

Client → server (JSON text frames)::

    {"id": "a1", "type": "generate", "text": "...", "sampling_params": {...}, ...}
    {"id": "a1", "type": "cancel"}

``generate`` takes /generate's body with one prompt. Server → client::

    {"id", "type": "delta", "index", "text", "output_ids", "stepped_at"[, "finish_reason"]}
    {"id", "type": "done", "meta_info": {...}[, "meta_infos": [{...}, ...]]}
                               (finish_reason "abort" after a cancel; with n > 1,
                               each sequence's meta_info in meta_infos)
    {"id", "type": "error", "status", "message"}

A bad frame is answered with an error frame for its id (null when it has none;
a frame too big, or not JSON, is answered for the id it begins with, as
rt.client's do, unless a request is in flight under it) and never closes the
connection. A cancel of an id not in flight (it ended before the cancel came,
or never was) does nothing, as /abort_request of a rid none has: answered with
a 404, a client that reused the id at once took it for its new request's end.
An error ends the request of its id, but for status 409: a ``generate`` whose
id is already in flight is refused alone, and the request in flight under that
id goes on (one that reuses the id, or the rid, of a request cancelled on the
connection waits for it to end, and is served: the cancel came first); so is
one past ``Settings.ws_max_in_flight`` in flight (429; a request cancelled
before it was sent makes room: it waits for that one's end, as a reused id
does). The client leaving aborts every generation it had in flight; a server
that stops closes each connection with 1001 once what it had in flight has been
answered. Frames go out through one writer task, with a bounded queue in front:
a slow reader holds back its own generations only. A frame refused (an error
frame to send) with the queue full waits for room, which holds back the
client's further frames: a client that reads and sends a burst of frames gets
every refusal, however many. That wait is bounded by the writer's progress, not
by the queue's length (the queue is full of the connection's own deltas
whenever its generations outpace the client): hypercorn tells of a client gone
through the task that receives frames, and were it waiting for a writer stuck
on that client, neither would ever move. A client whose writer has not finished
one send in ``UNREAD_S`` while a refusal waits does not read: it is closed with
1008, its generations aborted.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import h11
import trio

from rt.frontend.requests import MAX_RID_CHARS
from rt.gpu.sampling_params import INT64_MAX, INT64_MIN, show
from rt.http import native
from rt.http.asgi import HTTPError, Message, Receive, Send, encode, last_word
from rt.http.engine_port import Delta, answering
from rt.http.front import Front
from rt.http.generation import Result, Seq, run
from rt.http.schemas import GenerateRequest, WsFrame, loads, parse

log = logging.getLogger(__name__)

OUT_QUEUE = 256  # frames waiting for the writer
# the id a frame begins with: {"id": "a1", ... or {"id": 7, ...
_WS = r"[ \t\n\r]*"  # JSON's whitespace (not \s: Unicode's is no JSON)
HEAD_ID = re.compile(
    rf'\A{_WS}\{{{_WS}"id"{_WS}:{_WS}(-?\d{{1,19}}|"(?:[^"\\\x00-\x1f]|\\.){{0,6144}}"){_WS}[,}}]'
)
UNREAD_S = 10.0  # the writer in one send this long, a refusal waiting: the client does not read
GOING = "the server is shutting down"
UNREAD = f"the client left frames unread for {UNREAD_S:g} s and sent more"


@dataclass
class Running:
    """A generation in flight on a connection: its scope (cancelled by a ``cancel``
    frame) and its body's rid; ``ended`` is set once its last frame is queued."""

    scope: trio.CancelScope
    rid: Any
    ended: trio.Event = field(default_factory=trio.Event)


class Connection:
    def __init__(self, front: Front, send: Send) -> None:
        self.front = front
        self._send = send
        # frames for the writer, each with an event it sets once it has sent that frame
        self._out, self._out_recv = trio.open_memory_channel[tuple[bytes, trio.Event | None]](
            OUT_QUEUE
        )
        self.in_flight: dict[str | int, Running] = {}
        self._scope = trio.CancelScope()  # the connection's: cancelled when it ends
        self._unread = False  # the client does not read: closed with 1008
        self._sent = 0  # frames the writer has handed to the client: its progress

    async def serve(self, receive: Receive) -> None:
        left = False
        try:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                nursery.start_soon(self._write, nursery.cancel_scope)
                while True:
                    message = await receive()
                    if message["type"] == "websocket.disconnect":
                        left = True
                        break
                    if message["type"] == "websocket.receive":
                        await self._on_frame(nursery, message)  # waits on the writer only
                nursery.cancel_scope.cancel()
        finally:
            if not left and (self._unread or self.front.stopping):  # say why (not 1006)
                code, reason = (1008, UNREAD) if self._unread else (1001, GOING)
                with last_word():
                    await self._send({"type": "websocket.close", "code": code, "reason": reason})
                    while (await receive())["type"] != "websocket.disconnect":
                        pass  # the client's close frame: the handshake is complete

    async def _write(self, connection: trio.CancelScope) -> None:
        async for frame, sent in self._out_recv:
            try:
                await self._send({"type": "websocket.send", "text": frame.decode()})
            except Exception:  # the peer is gone: nothing in flight can be delivered
                connection.cancel()
                return
            self._sent += 1
            if sent is not None:
                sent.set()

    async def _frame(self, obj: dict[str, Any], sent: trio.Event | None = None) -> None:
        """Queue ``obj`` for the writer, which sets ``sent`` once it has sent it."""
        await self._out.send((encode(obj), sent))

    async def _answer(self, cid: Any, err: HTTPError) -> None:
        """The receiving task's own answer to a frame: with the queue full, it waits
        while the writer moves; a writer stuck in one send for ``UNREAD_S`` ends the
        connection instead (see the module docstring)."""
        self._count(err.status)
        frame = encode(_error_frame(cid, err))
        while True:
            sent = self._sent
            with trio.move_on_after(UNREAD_S):
                await self._out.send((frame, None))
                return
            if self._sent == sent:
                log.warning("WebSocket: %s; closing it", UNREAD)
                self._unread = True
                self._scope.cancel()
                return

    async def _on_frame(self, nursery: trio.Nursery, message: Message) -> None:
        data = message.get("text")
        if data is None:
            data = message.get("bytes") or b""
        size = len(data)
        if isinstance(data, str) and size * 4 > self.front.settings.max_body_size:
            size = len(data.encode("utf-8", "surrogatepass"))  # a character may be 4 bytes
        if size > self.front.settings.max_body_size:
            await self._answer(
                await self._refused_id(data),
                HTTPError(
                    413,
                    f"the frame has {size} bytes; at most {self.front.settings.max_body_size} are accepted",
                ),
            )
            return
        try:
            async with self.front.turn(size):
                obj = loads(data)
        except HTTPError as err:
            await self._answer(await self._refused_id(data), err)
            return
        if not isinstance(obj, dict):
            kind = "a list" if isinstance(obj, list) else type(obj).__name__
            problem = f"a frame is a JSON object with 'id' and 'type'; got {kind}"
            await self._answer(None, HTTPError(400, problem))
            return
        cid = obj.get("id")
        if isinstance(cid, bool) or not isinstance(cid, str | int):
            cid = None
        bad_id = id_problem(cid)
        if bad_id is not None:
            await self._answer(None, HTTPError(400, bad_id, param="id"))
            return
        try:
            frame = parse(WsFrame, obj)
            body = dict(frame.model_extra or {})
            if frame.type == "cancel":
                self._cancel(frame.id)
                return
            await self._after_cancelled(frame.id, body.get("rid"))
            if frame.id in self.in_flight:  # 409: this frame is refused, not the request
                raise HTTPError(
                    409,
                    f"id: {frame.id!r} is already in flight on this connection; this frame is "
                    "refused and that request goes on",
                    param="id",
                )
            limit = self.front.settings.ws_max_in_flight
            await self._room(limit)
            if len(self.in_flight) >= limit:  # a bound on what a client that never reads holds
                raise HTTPError(
                    429,
                    f"this connection has {len(self.in_flight)} requests in flight, the most "
                    f"it may have (--ws-max-in-flight {limit}); send this one when one is done",
                )
            async with self.front.turn(size):  # (every WebSocket request streams)
                req = parse(GenerateRequest, body)
            jobs, batch = native.build_jobs(self.front, req)
            if batch:
                field = native.prompt_field(req)
                raise HTTPError(
                    400, f"{field}: one prompt per frame (send one frame per prompt)", param=field
                )
        except HTTPError as err:
            await self._answer(cid, err)
            return
        running = Running(trio.CancelScope(), req.rid)
        self.in_flight[frame.id] = running
        nursery.start_soon(self._generate, frame.id, req, jobs, running)

    def _cancel(self, cid: str | int) -> None:
        running = self.in_flight.get(cid)
        if running is not None:  # (none: it ended before the cancel came, or never was)
            running.scope.cancel()

    async def _room(self, limit: int) -> None:
        """With ``limit`` requests in flight, wait for those cancelled to end (their
        aborts take milliseconds): a client that cancelled one to make room and sent
        a new one at once was refused (429) a third of the time. Bounded as
        :meth:`_after_cancelled` is, once for all of them."""
        with trio.move_on_after(UNREAD_S):
            for running in list(self.in_flight.values()):
                if len(self.in_flight) < limit:
                    return
                if running.scope.cancel_called:
                    await running.ended.wait()

    async def _refused_id(self, data: str | bytes) -> str | int | None:
        """The id to refuse a frame that cannot be parsed whole for: the one it begins
        with, unless a request is in flight under it (the error would say that one
        ended, and it goes on). One cancelled under it is waited for, as for a frame
        that parses (:meth:`_after_cancelled`): the cancel came first."""
        cid = head_id(data)
        if cid is not None:
            await self._after_cancelled(cid, None)
        return None if cid in self.in_flight else cid

    async def _after_cancelled(self, cid: str | int, rid: Any) -> None:
        """A ``generate`` that reuses the id, or the rid, of a request this connection
        cancelled waits for that one to end (its abort takes milliseconds): the
        client sent the cancel first, and frames are handled in order. (Refused
        while it was unwinding, a rid reused at once was a 400 about half the
        time.) A client that does not read can hold that end: the wait is bounded,
        and the frame is then refused as before."""
        for other_cid, running in list(self.in_flight.items()):
            reused = other_cid == cid or (rid is not None and running.rid == rid)
            if reused and running.scope.cancel_called:
                with trio.move_on_after(UNREAD_S):
                    await running.ended.wait()

    async def _generate(
        self, cid: str | int, req: GenerateRequest, jobs: Any, running: Running
    ) -> None:
        """Answer one request. The engine is held until the writer has sent its last
        frame, not only queued it: a drain used to end with the "done" frames of
        finished requests still queued for a client reading a little slower than
        they came, and the 1001 close then dropped them."""
        sent = trio.Event()
        with answering(self.front.engine):
            try:
                await self._answer_request(cid, req, jobs, running, sent)
            finally:
                del self.in_flight[cid]
                running.ended.set()
            await sent.wait()  # (the connection ending cancels it)

    async def _answer_request(
        self, cid: str | int, req: GenerateRequest, jobs: Any, running: Running, sent: trio.Event
    ) -> None:
        front, scope = self.front, running.scope
        so_far: list[Result | None] = [None]  # what a cancel answers with
        status = 499  # (unless answered: the connection ended first)

        async def on_delta(i: int, delta: Delta, result: Result) -> None:
            frame: dict[str, Any] = {
                "id": cid,
                "type": "delta",
                "index": delta.index,
                "text": delta.text,
                "output_ids": list(delta.output_ids),
                "stepped_at": delta.stepped_at,
            }
            if delta.finish_reason is not None:
                frame["finish_reason"] = native.finish_reason(result.seqs[delta.index], None)
            if delta.logprobs is not None and req.return_logprob:
                frame.update(
                    native.output_logprobs(
                        front, req, delta.output_ids, delta.logprobs, delta.top_logprobs
                    )
                )
            await self._frame(frame)

        try:
            if req.return_logprob and req.return_text_in_logprobs:
                await front.tokens.ensure()  # (loaded on first use, as /generate does)
            with scope:
                results = await run(front, jobs, on_delta, native.renames(req), so_far=so_far)
            if scope.cancelled_caught:
                partial = so_far[0] or Result(jobs[0].rid, [Seq()])  # (None: never started)
                partial.aborted = "cancelled by the client"
                results = [partial]
            else:
                status = 200
            await self._frame(_done(front, cid, req, results[0], scope.cancelled_caught), sent)
        except HTTPError as err:
            status = err.status
            await self._frame(_error_frame(cid, err), sent)
        except Exception:  # a bug answers this id alone; the connection's others go on
            log.exception("WebSocket request %r failed", cid)
            status = 500
            await self._frame(
                _error_frame(
                    cid, HTTPError(500, "internal error; the server log has the traceback")
                ),
                sent,
            )
        finally:
            self._count(status)

    def _count(self, status: int) -> None:
        """A ``generate`` frame answered (or refused) with ``status``, in
        ``rt_requests_total`` as /ws's (499: cancelled, or the connection ended)."""
        self.front.metrics.requests.labels("/ws", str(status)).inc()


def _done(
    front: Front, cid: Any, req: GenerateRequest, result: Result, cancelled: bool
) -> dict[str, Any]:
    """The ``done`` frame: ``meta_info`` as /generate's; with ``n > 1``, the
    request's own fields there (``completion_tokens`` counts every sequence, the
    prompt's logprobs are there once) and each sequence's ``meta_info`` under
    ``meta_infos``, by index. A cancel's finish_reason is the request's."""
    metas = [
        native.output(front, req, result, seq, j)["meta_info"] for j, seq in enumerate(result.seqs)
    ]
    if len(metas) > 1:
        shared = {"id", "prompt_tokens", "cached_tokens", "e2e_latency"}
        shared |= {"input_token_logprobs", "input_top_logprobs"} & metas[0].keys()
        meta = {k: metas[0][k] for k in shared}
        for each in metas:
            each.pop("input_token_logprobs", None)
            each.pop("input_top_logprobs", None)
    else:
        meta = metas[0] if metas else {"id": result.rid}
    if cancelled:
        meta["finish_reason"] = {"type": "abort", "message": "cancelled by the client"}
    elif len(metas) > 1 and result.aborted:  # (/abort_request: the request's, as a cancel's)
        meta["finish_reason"] = native.finish_reason(Seq(), result.aborted)
    meta["completion_tokens"] = result.completion_tokens
    frame = {"id": cid, "type": "done", "meta_info": meta}
    if len(metas) > 1:
        frame["meta_infos"] = metas
    return frame


def _error_frame(cid: Any, err: HTTPError) -> dict[str, Any]:
    frame = {"id": cid, "type": "error", "status": err.status, "message": err.message}
    if err.param is not None:
        frame["param"] = err.param
    for name, value in err.headers:
        if name == "retry-after":
            frame["retry_after"] = int(value)
    return frame


async def websocket(
    front: Front, scope: Any, receive: Receive, send: Send, refusal: HTTPError | None
) -> None:
    """Serve one connection; ``refusal`` (a missing API key, an origin not allowed)
    answers the handshake."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    if refusal is not None:
        if "websocket.http.response" in scope.get("extensions", {}):  # hypercorn's is
            body = encode(refusal.body())
            headers = [(k.encode(), v.encode()) for k, v in refusal.headers]
            headers += [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ]
            start = {"type": "websocket.http.response.start", "status": refusal.status}
            await send({**start, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:  # a server without the extension refuses the handshake with a 403
            await send({"type": "websocket.close", "code": 1008, "reason": refusal.message[:120]})
        return
    try:
        await send({"type": "websocket.accept"})
    except h11.LocalProtocolError as err:  # hypercorn refused the handshake already (a
        log.info("a WebSocket handshake was refused before rt answered it: %s", err)
        return  # 400 for a frame sent before the 101): nothing of it to serve
    await Connection(front, send).serve(receive)


def head_id(data: str | bytes) -> str | int | None:
    """The id a frame that cannot be parsed whole (too big, or not JSON) begins
    with, when it is one a frame may have; else None. (Answered for id null, an
    rt.client request whose frame was over the size limit waited for good.)"""
    head = data[: MAX_RID_CHARS * 6 + 64]  # (the longest id, every character escaped)
    if isinstance(head, bytes):
        head = head.decode("utf-8", "replace")
    match = HEAD_ID.match(head)
    if match is None:
        return None
    try:
        cid = json.loads(match.group(1))  # (a string or an int: what the pattern takes)
    except ValueError:
        return None
    return cid if id_problem(cid) is None else None


def id_problem(cid: str | int | None) -> str | None:
    """Why ``cid`` can be no frame's id, or None. Every frame for an id repeats it
    (an 8 MB id, 256 frames queued: 1 GB), so it must be short and encode."""
    if (isinstance(cid, str) and len(cid) > MAX_RID_CHARS) or (
        isinstance(cid, int) and not INT64_MIN <= cid <= INT64_MAX
    ):
        return (
            f"id: expected a string of at most {MAX_RID_CHARS} characters or a 64-bit "
            f"integer, got {show(cid)}"
        )
    if isinstance(cid, str) and not cid.isascii():
        try:
            cid.encode("utf-8")
        except UnicodeEncodeError:
            return "id: expected a string of valid Unicode, got one with a lone surrogate"
    return None

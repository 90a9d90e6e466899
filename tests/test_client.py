"""rt.client against a stand-in WebSocket server.

The stand-in (``FakeServer``) speaks exactly the ``/ws`` protocol of issue 11
(``generate`` / ``cancel`` in; ``delta``, ``done``, ``error`` out) with canned
behaviours chosen by the prompt's text, so that the client's own work —
multiplexing, routing by id, cancel, error frames, a lost connection — is
tested in milliseconds and deterministically. The real rt-serve's tests
(tests/http/) drive this client end to end against the engine.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
import trio
import trio_websocket

from rt import errors
from rt.client import Delta, RemoteError, connect, ws_url

Frame = dict[str, Any]


class FakeServer:
    """One behaviour per prompt text: words → one delta per word then done;
    ``hang`` → one delta then nothing until cancelled; ``bad`` → an error frame;
    ``drop`` → the server closes the connection; ``noise`` → frames no request
    waits for, then a normal answer."""

    def __init__(self, api_key: str | None = None) -> None:
        self.api_key = api_key
        self.url = ""
        self.received: list[Frame] = []
        self.connections = 0
        self.started: dict[str, trio.Event] = {}  # by the body's rid
        self.cancelled: dict[str, trio.Event] = {}  # by the body's rid

    def event(self, table: dict[str, trio.Event], rid: str) -> trio.Event:
        return table.setdefault(rid, trio.Event())

    async def handle(self, request: trio_websocket.WebSocketRequest) -> None:
        auth = dict(request.headers).get(b"authorization")
        if self.api_key and auth != f"Bearer {self.api_key}".encode():
            await request.reject(401, body=b"missing or wrong Authorization: Bearer")
            return
        ws = await request.accept()
        self.connections += 1
        running: dict[str, tuple[trio.CancelScope, str]] = {}
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    frame = json.loads(await ws.get_message())
                except trio_websocket.ConnectionClosed:
                    nursery.cancel_scope.cancel()
                    return
                self.received.append(frame)
                if frame["type"] == "generate":
                    scope = trio.CancelScope()
                    running[frame["id"]] = (scope, frame.get("rid", ""))
                    nursery.start_soon(self.generate, ws, frame, scope)
                elif frame["type"] == "cancel" and frame["id"] in running:
                    scope, rid = running.pop(frame["id"])
                    scope.cancel()
                    self.event(self.cancelled, rid).set()

    async def generate(
        self, ws: trio_websocket.WebSocketConnection, frame: Frame, scope: trio.CancelScope
    ) -> None:
        fid, text = frame["id"], frame.get("text", "")
        self.event(self.started, frame.get("rid", "")).set()
        with scope:
            if text == "bad":
                await ws.send_message(
                    json.dumps(
                        {"id": fid, "type": "error", "status": 400, "message": "temperature < 0"}
                    )
                )
                return
            if text == "drop":
                await ws.aclose(1011, "the stand-in dropped it")
                return
            if text == "noise":
                for junk in ("not json", "[1, 2]", '{"id": "nope", "type": "delta"}'):
                    await ws.send_message(junk)
                await ws.send_message(json.dumps({"id": fid, "type": "progress"}))
            words = ["hang"] if text == "hang" else text.split()
            n = frame.get("sampling_params", {}).get("n", 1)
            for k, word in enumerate(words):
                for index in range(n):
                    delta = {"id": fid, "type": "delta", "text": word, "output_ids": [len(word)]}
                    if k == len(words) - 1 and text != "hang":
                        delta["finish_reason"] = {"type": "length", "length": len(words)}
                    await ws.send_message(json.dumps({**delta, "index": index} if n > 1 else delta))
                await trio.sleep(0)  # let the other requests' frames interleave
            if text == "hang":
                await trio.sleep_forever()
            body = {k: v for k, v in frame.items() if k not in ("id", "type")}
            done = {"id": fid, "type": "done", "meta_info": {"finish_reason": "stop", "body": body}}
            await ws.send_message(json.dumps(done))


async def start(nursery: trio.Nursery, fake: FakeServer) -> FakeServer:
    server = await nursery.start(
        partial(trio_websocket.serve_websocket, fake.handle, "127.0.0.1", 0, None)
    )
    fake.url = f"ws://127.0.0.1:{server.port}/ws"
    return fake


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[FakeServer]:
    with trio.fail_after(20):
        yield await start(nursery, FakeServer())


def test_ws_url_accepts_the_servers_http_address_or_a_ws_url() -> None:
    assert ws_url("http://127.0.0.1:30000") == "ws://127.0.0.1:30000/ws"
    assert ws_url("https://h:1/") == "wss://h:1/ws"
    assert ws_url("ws://h:1/ws") == "ws://h:1/ws"
    with pytest.raises(ValueError, match="expected a ws://"):
        ws_url("ftp://h/ws")


async def test_generate_returns_the_generate_endpoints_shape(server: FakeServer) -> None:
    async with connect(server.url) as client:
        out = await client.generate(
            "in the beginning", sampling_params={"max_new_tokens": 3}, rid="r1"
        )
    assert out == {
        "text": "inthebeginning",
        "output_ids": [2, 3, 9],
        "meta_info": {
            "finish_reason": "stop",
            "body": {
                "text": "in the beginning",
                "sampling_params": {"max_new_tokens": 3},
                "rid": "r1",
            },
        },
    }


async def test_stream_yields_deltas_then_holds_meta_info(server: FakeServer) -> None:
    async with connect(server.url) as client:
        stream = client.stream(input_ids=[1, 2], text="a bb")
        deltas = [d async for d in stream]
    assert [(d.text, d.output_ids, d.index) for d in deltas] == [("a", (1,), 0), ("bb", (2,), 0)]
    assert [d.finish_reason for d in deltas] == [None, {"type": "length", "length": 2}]
    assert isinstance(deltas[0], Delta) and deltas[0].frame["type"] == "delta"
    assert stream.meta_info is not None and stream.meta_info["body"]["input_ids"] == [1, 2]


async def test_several_sequences_come_back_as_a_list_by_index(server: FakeServer) -> None:
    async with connect(server.url) as client:
        outs = await client.generate("two words", sampling_params={"n": 2})
    assert [(o["text"], o["output_ids"]) for o in outs] == [("twowords", [3, 5])] * 2


async def test_cancelling_the_awaiting_task_sends_cancel_and_spares_the_others(
    server: FakeServer,
) -> None:
    results: dict[int, Any] = {}
    async with connect(server.url) as client:

        async def one(i: int) -> None:
            results[i] = await client.generate(" ".join(f"w{i}x{k}" for k in range(5)))

        async def victim(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await client.generate("hang", rid="victim")
            assert scope.cancelled_caught

        async with trio.open_nursery() as nursery:
            victim_scope = await nursery.start(victim)
            for i in range(15):
                nursery.start_soon(one, i)
            await server.event(server.started, "victim").wait()
            victim_scope.cancel()
            await server.event(server.cancelled, "victim").wait()
        assert client.in_flight == 0
    assert server.connections == 1
    assert sum(f["type"] == "generate" for f in server.received) == 16
    victim_id = next(f["id"] for f in server.received if f.get("rid") == "victim")
    assert [f for f in server.received if f["type"] == "cancel"] == [
        {"id": victim_id, "type": "cancel"}
    ]
    for i in range(15):
        assert results[i]["text"] == "".join(f"w{i}x{k}" for k in range(5))
        assert results[i]["output_ids"] == [len(f"w{i}x{k}") for k in range(5)]


async def test_leaving_a_stream_early_sends_cancel(server: FakeServer) -> None:
    async with connect(server.url) as client:
        async for delta in client.stream("hang", rid="left"):
            assert delta.text == "hang"
            break
        await server.event(server.cancelled, "left").wait()
        assert client.in_flight == 0
        # Frames already on their way for the cancelled id are dropped; the connection goes on.
        assert (await client.generate("still here"))["text"] == "stillhere"


async def test_an_error_frame_raises_remote_error_for_that_request_only(
    server: FakeServer,
) -> None:
    async with connect(server.url) as client:
        with pytest.raises(RemoteError) as caught:
            await client.generate("bad")
        assert caught.value.status == 400
        assert caught.value.message == "temperature < 0"
        assert isinstance(caught.value, errors.RequestError)
        assert (await client.generate("fine then"))["text"] == "finethen"
        assert client.in_flight == 0


async def test_frames_no_request_waits_for_are_dropped(server: FakeServer) -> None:
    async with connect(server.url) as client:
        out = await client.generate("noise then words")
    assert out["text"] == "noisethenwords"


async def test_a_closed_connection_fails_every_pending_request_and_later_ones(
    server: FakeServer,
) -> None:
    failures: list[BaseException] = []
    async with connect(server.url) as client:

        async def hang(rid: str) -> None:
            try:
                await client.generate("hang", rid=rid)
            except errors.Broken as err:
                failures.append(err)

        async with trio.open_nursery() as nursery:
            for rid in ("a", "b", "c"):
                nursery.start_soon(hang, rid)
                await server.event(server.started, rid).wait()
            with pytest.raises(errors.Broken, match="1011"):
                await client.generate("drop")
        assert len(failures) == 3
        assert all("closed" in str(err) and "1011" in str(err) for err in failures)
        with pytest.raises(errors.Broken, match="open a new connection"):
            await client.generate("too late")
        assert client.in_flight == 0


async def test_a_client_used_after_its_block_raises_closed(server: FakeServer) -> None:
    async with connect(server.url) as client:
        pass
    with pytest.raises(errors.Closed, match="async with"):
        await client.generate("anyone there")


async def test_the_bodys_exception_comes_out_unwrapped(server: FakeServer) -> None:
    with pytest.raises(KeyError):
        async with connect(server.url):
            raise KeyError("mine")


async def test_api_key_is_sent_and_a_refused_handshake_says_why(nursery: trio.Nursery) -> None:
    fake = await start(nursery, FakeServer(api_key="sesame"))
    with pytest.raises(errors.Broken, match="HTTP 401: missing or wrong Authorization"):
        async with connect(fake.url):
            pass
    async with connect(fake.url, api_key="sesame") as client:
        assert (await client.generate("open up"))["text"] == "openup"


async def test_nothing_listening_raises_broken() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(errors.Broken, match="is rt-serve listening"):
        async with connect(f"ws://127.0.0.1:{port}/ws", connect_timeout=5):
            pass


async def test_a_server_that_never_answers_the_handshake_times_out(nursery: trio.Nursery) -> None:
    async def mute(stream: trio.SocketStream) -> None:
        async with stream:
            await trio.sleep_forever()

    listeners = await nursery.start(partial(trio.serve_tcp, mute, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    with pytest.raises(
        errors.Broken, match=r"did not complete the WebSocket handshake within 0\.2 s"
    ):
        async with connect(f"ws://127.0.0.1:{port}/ws", connect_timeout=0.2):
            pass


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"text": b"hi"}, r"text: expected a JSON value .* got bytes b'hi'"),
        (
            {"sampling_params": {"temperature": float("nan")}},
            r"sampling_params\.temperature: expected a finite number, got nan",
        ),
        ({"sampling_params": {"stop": ["a", float("inf")]}}, r"sampling_params\.stop\[1\]: .*inf"),
        ({"text": "a\ud800b"}, r"text: the text is not valid Unicode: a lone surrogate"),
        ({"sampling_params": {"seed": object()}}, r"sampling_params\.seed: .*got object"),
        ({"logit_bias": {5: 1.0, "5": 2.0}}, r"logit_bias: expected string keys, got 5"),
        (
            {"sampling_params": {"x": _deep(100)}},
            r"sampling_params\.x.*: expected at most 32 levels",
        ),
    ],
)
async def test_a_body_json_cannot_carry_as_given_is_refused_and_nothing_is_sent(
    server: FakeServer, body: Frame, says: str
) -> None:
    """msgspec sent bytes as base64 text and NaN as null (the server then ran
    another request than the one asked for, with no error), and a body it could
    not encode left ``in_flight`` at 1 for good."""
    async with connect(server.url) as client:
        with pytest.raises(errors.InvalidRequestError, match=says) as refused:
            await client.generate(**{"text": "never sent", **body})
        assert isinstance(refused.value, ValueError)
        assert client.in_flight == 0
        assert (await client.generate("still fine"))["text"] == "stillfine"
    assert [f.get("text") for f in server.received] == ["still fine"]

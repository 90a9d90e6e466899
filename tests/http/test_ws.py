"""``/ws``: many generations on one WebSocket, cancellation, bad frames."""

from __future__ import annotations

import itertools
import json
import socket
from typing import Any

import httpx
import pytest
import trio
from serverlib import Server, running_server
from trio_websocket import WebSocketConnection, open_websocket_url
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Message, Request

from rt.client import connect

SUBJECTS = ("LORD", "God", "king", "man", "woman", "priest", "people", "angel")
PLACES = ("beginning", "day", "night", "land", "house", "city", "temple", "field")
PROMPTS = [f"And the {s} said" for s in SUBJECTS] + [f"In the {p}" for p in PLACES]


async def receive(ws: WebSocketConnection) -> dict[str, Any]:
    with trio.fail_after(60):
        frame: dict[str, Any] = json.loads(await ws.get_message())
    return frame


async def slow_reader(port: int) -> tuple[trio.SocketStream, WSConnection]:
    """A /ws connection over a socket with a 4 KiB receive buffer, which the test
    reads (through wsproto) only when it chooses: a client that stops reading."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    await stream.socket.connect(("127.0.0.1", port))
    ws = WSConnection(ConnectionType.CLIENT)
    await stream.send_all(ws.send(Request(host="127.0.0.1", target="/ws")))
    with trio.fail_after(10):
        while not any(isinstance(e, AcceptConnection) for e in ws.events()):
            ws.receive_data(await stream.receive_some(65536))
    return stream, ws


async def scheduler_idle_after(server: Server, steps: int) -> dict[str, Any]:
    """The scheduler's first idle report after step ``steps`` (nothing running or
    waiting: it also reports every second while busy)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        with trio.fail_after(20):
            while True:
                stats = (await client.get("/server_info")).json()["scheduler"]
                busy = stats is None or stats["running"] or stats["waiting"]
                if not busy and stats["steps"] > steps:
                    return dict(stats)
                await trio.sleep(0.05)


async def test_16_requests_on_one_connection_one_cancelled(default_server: Server) -> None:
    greedy = {"max_new_tokens": 24, "temperature": 0.0}
    async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
        expected = (
            await client.post("/generate", json={"text": PROMPTS, "sampling_params": greedy})
        ).json()
        steps_before = (await client.get("/server_info")).json()["scheduler"]["steps"]
    victim = 5
    texts: dict[int, str] = {i: "" for i in range(16)}
    done: dict[int, dict[str, Any]] = {}
    async with open_websocket_url(f"ws://127.0.0.1:{default_server.port}/ws") as ws:
        for i, prompt in enumerate(PROMPTS):
            params = (
                {"max_new_tokens": 400, "temperature": 0.0, "ignore_eos": True}
                if i == victim
                else greedy
            )
            await ws.send_message(
                json.dumps({"id": i, "type": "generate", "text": prompt, "sampling_params": params})
            )
        cancelled = False
        while len(done) < 16:
            frame = await receive(ws)
            assert frame["type"] in ("delta", "done"), frame
            if frame["type"] == "delta":
                texts[frame["id"]] += frame["text"]
                if frame["id"] == victim and not cancelled:
                    cancelled = True
                    await ws.send_message(json.dumps({"id": victim, "type": "cancel"}))
            else:
                done[frame["id"]] = frame["meta_info"]
    assert done[victim]["finish_reason"]["type"] == "abort"
    assert 0 < done[victim]["completion_tokens"] < 400
    for i in range(16):
        if i != victim:
            assert texts[i] == expected[i]["text"], i
            assert done[i]["finish_reason"] == {"type": "length", "length": 24}
    stats = await scheduler_idle_after(default_server, steps_before)
    assert stats["request_tokens"] == 0  # the cancelled request's KV is free


async def test_bad_frames_get_error_frames_and_the_connection_lives(default_server: Server) -> None:
    async with open_websocket_url(f"ws://127.0.0.1:{default_server.port}/ws") as ws:
        await ws.send_message(
            json.dumps(
                {
                    "id": "long",
                    "type": "generate",
                    "text": "In the",
                    "sampling_params": {"max_new_tokens": 48, "ignore_eos": True},
                }
            )
        )
        bad: list[tuple[str | bytes, Any, str]] = [
            ("this is not json", None, "JSON"),
            ("[1, 2]", None, ""),
            (b"\xff\xfe", None, "JSON"),
            (json.dumps({"id": "a"}), "a", "type"),
            (json.dumps({"id": "b", "type": "sing"}), "b", "type"),
            (json.dumps({"id": "c", "type": "generate"}), "c", "text"),
            (
                json.dumps(
                    {
                        "id": "d",
                        "type": "generate",
                        "text": "x",
                        "sampling_params": {"temperature": "hot"},
                    }
                ),
                "d",
                "temperature",
            ),
            (
                json.dumps(
                    {
                        "id": "e",
                        "type": "generate",
                        "text": "x",
                        "sampling_params": {"max_new_tokens": -1},
                    }
                ),
                "e",
                "max_new_tokens",
            ),
            (json.dumps({"id": "f", "type": "generate", "text": "x", "bogus": 1}), "f", "bogus"),
            # not JSON, but its id can be read: its refusal ends that id's request
            ('{"id": "z", "type": "generate", "text": "x",}', "z", "JSON"),
            # unless a request is in flight under it: that one goes on (refused for none)
            ('{"id": "long", "type": "generate", "text": "x",}', None, "JSON"),
            (
                json.dumps({"id": "long", "type": "generate", "text": "x"}),
                "long",
                "already in flight",
            ),
            (json.dumps({"id": "h", "type": "generate", "text": "word " * 600}), "h", "context"),
            ('{"id": "i", "type": "generate", "text": "\\ud800"}', "i", "surrogate"),
            (
                json.dumps({"id": "j", "type": "generate", "input_ids": [[5], [6]]}),
                "j",
                "input_ids: one prompt per frame",
            ),
            # every frame of the generation repeats its id and rid: both are bounded
            (json.dumps({"id": "x" * 1025, "type": "generate", "text": "x"}), None, "1024 char"),
            (json.dumps({"id": 1 << 63, "type": "generate", "text": "x"}), None, "64-bit"),
            (  # the smallest 64-bit integer is one (it was refused as not)
                json.dumps({"id": -(1 << 63), "type": "generate", "text": "x", "bogus": 1}),
                -(1 << 63),
                "bogus",
            ),
            (
                json.dumps({"id": "k", "type": "generate", "text": "x", "rid": "r" * 1025}),
                "k",
                "rid: expected at most 1024 characters",
            ),
        ]
        for frame, _, _ in bad:
            await ws.send_message(frame)
        # a cancel of an id not in flight does nothing (a 404 for it, coming after a
        # generate that reused the id, was taken for that request's end)
        await ws.send_message(json.dumps({"id": "g", "type": "cancel"}))
        errors: list[dict[str, Any]] = []
        long_done = None
        while len(errors) < len(bad) or long_done is None:
            frame = await receive(ws)
            if frame["type"] == "error":
                errors.append(frame)
            elif frame["type"] == "done":
                long_done = frame
        assert long_done["id"] == "long"
        assert long_done["meta_info"]["finish_reason"]["type"] == "length"
        # the refusal of a second "long" is a 409: it does not end the "long" in flight;
        # one that is no JSON is refused for no id
        assert [e["status"] for e in errors if e["id"] == "long"] == [409]
        by_id: dict[Any, list[dict[str, Any]]] = {}
        for e in errors:
            assert 400 <= e["status"] < 500, e
            by_id.setdefault(e["id"], []).append(e)
        for _, cid, needle in bad:
            assert any(needle in e["message"] for e in by_id[cid]), (cid, needle, by_id.get(cid))
        await ws.send_message(
            json.dumps(
                {
                    "id": "after",
                    "type": "generate",
                    "text": "In the",
                    "sampling_params": {"max_new_tokens": 2, "ignore_eos": True},
                }
            )
        )
        frames = [await receive(ws)]
        while frames[-1]["type"] == "delta":  # (two tokens may come in one delta)
            frames.append(await receive(ws))
        assert frames[-1]["type"] == "done" and frames[-1]["id"] == "after", frames
        assert sum(len(f.get("output_ids", ())) for f in frames) == 2, frames
        assert not [f for f in errors + frames if f["id"] == "g"]


def masked_text_frame(payload: bytes, announce: int | None = None) -> bytes:
    """A client's text frame (masked, with a zero mask), announcing ``announce``
    bytes where given (more than it carries: a frame cut short)."""
    size = len(payload) if announce is None else announce
    head = (
        bytes([0x81, 0x80 | size]) if size < 126 else bytes([0x81, 0x80 | 126]) + size.to_bytes(2)
    )
    return head + bytes(4) + payload


async def test_frames_sent_before_the_handshake_is_answered_close_that_connection_alone(
    default_server: Server,
) -> None:
    """A client that sends frames without waiting for the 101 (RFC 6455 says not
    to) gets its connection closed; rt-serve stopped (hypercorn's error left the
    connection, and the server with it), every time. The frame rides in the
    handshake's write, so that it is there before any answer, on any machine."""
    handshake = (
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    errors_before = sum("Error in ASGI Framework" in line for line in default_server.log)
    frames = [  # a whole generate frame, and one cut short
        masked_text_frame(json.dumps({"id": 1, "type": "generate", "text": "In"}).encode()),
        masked_text_frame(b"x" * 10, announce=1000),
    ]
    for frame in frames:
        with socket.create_connection(("127.0.0.1", default_server.port), timeout=30) as sock:
            sock.sendall(handshake + frame)
            answer = b""
            while chunk := sock.recv(4096):  # the server closes it
                answer += chunk
        assert not answer.startswith(b"HTTP/1.1 101")
    await trio.sleep(0.5)  # the server would have stopped by now
    assert default_server.proc.poll() is None
    async with connect(default_server.url) as client:  # and it serves a WebSocket
        params = {"max_new_tokens": 2, "ignore_eos": True}
        reply = await client.generate("In the", sampling_params=params)
        assert reply["meta_info"]["completion_tokens"] == 2
    assert any("a connection failed in hypercorn" in line for line in default_server.log)
    # the app's handshake answer, which hypercorn refused, is no traceback in the log
    assert sum("Error in ASGI Framework" in line for line in default_server.log) == errors_before


async def test_closing_the_socket_aborts_its_requests(default_server: Server) -> None:
    async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
        steps = (await client.get("/server_info")).json()["scheduler"]["steps"]
    params = {"max_new_tokens": 400, "ignore_eos": True}
    async with open_websocket_url(f"ws://127.0.0.1:{default_server.port}/ws") as ws:
        for i in range(2):
            await ws.send_message(
                json.dumps(
                    {"id": i, "type": "generate", "text": PROMPTS[i], "sampling_params": params}
                )
            )
        for _ in range(4):
            assert (await receive(ws))["type"] == "delta"
    left_at = trio.current_time()
    stats = await scheduler_idle_after(default_server, steps)
    assert trio.current_time() - left_at < 5.0  # 400 tokens would take far longer
    assert stats["running"] == 0
    assert stats["request_tokens"] == 0


@pytest.mark.slow
async def test_frames_that_used_to_close_the_connection_get_error_frames_or_answers() -> None:
    # a server of its own: the token texts of logprobs must not have been loaded yet
    with running_server("--max-body-size=100000") as server:
        async with open_websocket_url(f"ws://127.0.0.1:{server.port}/ws") as ws:
            long = {"type": "generate", "text": "In the", "sampling_params": {"max_new_tokens": 64}}
            await ws.send_message(json.dumps({"id": "long", **long}))
            # an id every frame must repeat, that UTF-8 cannot carry (it closed with 1011)
            await ws.send_message('{"id": "\\ud800", "type": "generate", "text": "x"}')
            # token texts in logprobs, asked first on this WebSocket (it closed with 1011)
            text_lp = {
                "id": "lp",
                "type": "generate",
                "text": "In the",
                "return_logprob": True,
                "return_text_in_logprobs": True,
                "sampling_params": {"max_new_tokens": 3, "ignore_eos": True},
            }
            await ws.send_message(json.dumps(text_lp))
            # 60,000 characters, 120,000 bytes: over the limit (it was counted in characters)
            await ws.send_message(
                json.dumps({"id": "wide", "pad": "é" * 60_000}, ensure_ascii=False)
            )
            got: dict[Any, dict[str, Any]] = {}
            needed = {"long", "lp", ("error", 400), "wide"}
            while not needed <= got.keys():
                frame = await receive(ws)
                if frame["type"] != "delta":  # errors without an id: by their status
                    key = frame["id"] if frame["id"] is not None else ("error", frame["status"])
                    got.setdefault(key, frame)
        assert got["long"]["type"] == "done"
        assert got["lp"]["type"] == "done"
        lps = got["lp"]["meta_info"]["output_token_logprobs"]
        assert len(lps) == 3 and all(isinstance(text, str) for _, _, text in lps)
        assert "lone surrogate" in got[("error", 400)]["message"]
        assert got[("error", 400)]["param"] == "id"
        # refused for the id it begins with (for none, rt.client's request waited for good)
        assert got["wide"]["status"] == 413 and "120" in got["wide"]["message"]
        assert all(a["restart_count"] == 0 for a in server.info()["actors"])


async def test_a_client_that_sends_but_never_reads_is_closed_and_its_generation_freed(
    default_server: Server,
) -> None:
    """Its frames answered with errors fill the queue to the writer, which waits on
    the client: the task that receives frames must not wait behind it (hypercorn
    tells of the client leaving through that task), or neither moves again and the
    generation stays in flight for good."""
    stream, ws = await slow_reader(default_server.port)
    long = {"max_new_tokens": 400, "ignore_eos": True}
    body = {"id": "g", "type": "generate", "text": "In the beginning", "sampling_params": long}
    await stream.send_all(ws.send(Message(data=json.dumps(body))))
    ended = False  # the server closed the connection (a reset: it leaves data unread)
    with trio.move_on_after(5):  # bad frames: each answered with an error frame, never read
        for n in itertools.count():
            frame = {"id": f"nope{n}", "type": "sing", "pad": "x" * 1000}
            try:
                await stream.send_all(ws.send(Message(data=json.dumps(frame))))
            except trio.BrokenResourceError:
                ended = True
                break
    async with httpx.AsyncClient(base_url=default_server.url, timeout=30) as client:
        # (closed once a refusal has waited UNREAD_S, 10 s, on a writer that cannot
        # move; that wait begins when the queue fills, later on a loaded machine: 20 s
        # here ran out once in a full run)
        with trio.fail_after(45):
            while (await client.get("/server_info")).json()["requests_in_flight"]:
                await trio.sleep(0.1)
    with trio.move_on_after(10):  # what was queued, then the close frame, an end or a reset
        while not ended:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            ws.receive_data(data or None)
            for event in ws.events():
                if isinstance(event, CloseConnection):
                    assert event.code == 1008 and "unread" in event.reason
                    data = b""
            ended = not data
    await stream.aclose()
    assert ended, "the server still holds the connection"


async def test_delta_frames_carry_the_logprobs_asked_for(default_server: Server) -> None:
    body = {
        "type": "generate",
        "text": "In the beginning",
        "sampling_params": {"max_new_tokens": 6, "temperature": 0.0},
        "return_logprob": True,
        "top_logprobs_num": 3,
        "return_text_in_logprobs": True,
    }
    async with open_websocket_url(f"ws://127.0.0.1:{default_server.port}/ws") as ws:
        await ws.send_message(json.dumps({"id": "lp", **body}))
        deltas = []
        while (frame := await receive(ws))["type"] == "delta":
            deltas.append(frame)
        assert frame["type"] == "done", frame
        await ws.send_message(json.dumps({"id": "s", **body, "stream": "yes"}))
        refused = await receive(ws)
    entries = [e for d in deltas for e in d["output_token_logprobs"]]
    tops = [t for d in deltas for t in d["output_top_logprobs"]]
    assert [tok for _, tok, _ in entries] == [t for d in deltas for t in d["output_ids"]]
    assert len(entries) == len(tops) == 6
    for top, (_, tok, _) in zip(tops, entries, strict=True):
        assert len(top) == 3 and top[0][1] == tok  # greedy: the best is the token
    assert "".join(text for _, _, text in entries) == "".join(d["text"] for d in deltas)
    assert refused["type"] == "error" and refused["id"] == "s" and "stream" in refused["message"]


async def test_with_n_above_1_the_done_frame_gives_each_sequence_its_meta_info(
    default_server: Server,
) -> None:
    """It carried sequence 0's finish_reason as the request's (and its length as
    every sequence's in the client's answer)."""
    differed = False
    params = {"n": 3, "max_new_tokens": 6, "temperature": 1.0, "stop": [" the"]}
    async with open_websocket_url(f"ws://127.0.0.1:{default_server.port}/ws") as ws:
        for seed in range(6):
            body = {"text": "And the LORD said", "sampling_params": {**params, "seed": seed}}
            await ws.send_message(json.dumps({"id": seed, "type": "generate", **body}))
            ends: dict[int, Any] = {}
            ids: dict[int, list[int]] = {0: [], 1: [], 2: []}
            while (frame := await receive(ws))["type"] == "delta":
                ids[frame["index"]] += frame["output_ids"]
                if "finish_reason" in frame:
                    ends[frame["index"]] = frame["finish_reason"]
            assert frame["type"] == "done", frame
            metas = frame["meta_infos"]
            assert [m["finish_reason"] for m in metas] == [ends[i] for i in range(3)]
            assert [m["completion_tokens"] for m in metas] == [len(ids[i]) for i in range(3)]
            assert frame["meta_info"]["completion_tokens"] == sum(map(len, ids.values()))
            assert "finish_reason" not in frame["meta_info"]  # the request has none of its own
            differed |= len({json.dumps(e) for e in ends.values()}) > 1
        # the prompt's logprobs once, in the request's own meta_info
        lp = {"text": "In the beginning", "return_logprob": True, "logprob_start_len": 0}
        await ws.send_message(
            json.dumps({"id": "lp", "type": "generate", **lp, "sampling_params": params})
        )
        while (frame := await receive(ws))["type"] == "delta":
            pass
        assert (
            len(frame["meta_info"]["input_token_logprobs"]) == frame["meta_info"]["prompt_tokens"]
        )
        assert all("input_token_logprobs" not in m for m in frame["meta_infos"])
        assert all(
            len(m["output_token_logprobs"]) == m["completion_tokens"] for m in frame["meta_infos"]
        )
        # a cancel's finish_reason is the request's
        long = {**params, "max_new_tokens": 400, "ignore_eos": True, "stop": []}
        await ws.send_message(
            json.dumps({"id": "c", "type": "generate", "text": "In", "sampling_params": long})
        )
        assert (await receive(ws))["type"] == "delta"
        await ws.send_message(json.dumps({"id": "c", "type": "cancel"}))
        while (frame := await receive(ws))["type"] == "delta":
            pass
        assert frame["meta_info"]["finish_reason"]["type"] == "abort", frame
    assert differed, "no seed gave sequences that ended differently: the test proves nothing"
    async with connect(default_server.url) as client:  # rt.client: the same, by index
        outs = await client.generate("And the LORD said", sampling_params={**params, "seed": 2})
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [
        len(o["output_ids"]) for o in outs
    ]


async def test_an_id_or_rid_reused_right_after_its_cancel_is_served(default_server: Server) -> None:
    """Cancel, then at once a ``generate`` with the same id (or rid): the frames
    came in that order, so the second is served, after the first's ``done``. It
    was refused (409 for the id, 400 for the rid) about half the time, while the
    cancelled request was still unwinding."""
    long = {"max_new_tokens": 400, "ignore_eos": True}
    async with open_websocket_url(f"ws://127.0.0.1:{default_server.port}/ws") as ws:
        for attempt in range(8):
            same_rid = attempt % 2 == 1  # a new frame id with the same rid, or the same id
            again = f"again{attempt}" if same_rid else "a"
            first = {"id": "a", "type": "generate", "rid": "mine", "text": "In the beginning"}
            await ws.send_message(json.dumps({**first, "sampling_params": long}))
            assert (await receive(ws))["type"] == "delta"
            short = {"max_new_tokens": 2, "ignore_eos": True}  # (it ends at its length)
            second = {**first, "id": again, "sampling_params": short}
            await ws.send_message(json.dumps({"id": "a", "type": "cancel"}))
            await ws.send_message(json.dumps(second))
            frames = []
            while sum(f["type"] == "done" for f in frames) < 2:
                frames.append(await receive(ws))
                assert frames[-1]["type"] != "error", (attempt, frames[-1])
            dones = [f for f in frames if f["type"] == "done"]
            assert [d["id"] for d in dones] == ["a", again]
            assert dones[0]["meta_info"]["finish_reason"]["type"] == "abort"
            assert dones[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
            assert dones[-1]["meta_info"]["id"] == "mine"
        # a frame that is no JSON reusing the cancelled id: refused for that id, after
        # its done (it was refused for id null while the cancelled one unwound)
        await ws.send_message(json.dumps({**first, "sampling_params": long}))
        assert (await receive(ws))["type"] == "delta"
        await ws.send_message(json.dumps({"id": "a", "type": "cancel"}))
        await ws.send_message('{"id": "a", "type": "generate", "text": "x",}')
        frames = [await receive(ws)]
        while frames[-1]["type"] != "error":
            frames.append(await receive(ws))
        assert [(f["id"], f["type"]) for f in frames if f["type"] != "delta"] == [
            ("a", "done"),
            ("a", "error"),
        ]


@pytest.mark.parametrize("how", ["abort_request", "cancel"])
async def test_a_done_frame_counts_only_the_tokens_its_client_was_sent(
    default_server: Server, how: str
) -> None:
    """A request the engine had finished while its deltas waited behind a slow
    reader, then cancelled: its deltas were dropped, yet its "done" frame said
    "length" with every token counted, a truncated answer marked complete. It now
    says abort, with the tokens sent. /abort_request finds nothing left to stop
    (as SGLang's): its client gets the whole answer."""
    stream, ws = await slow_reader(default_server.port)

    async def send(frame: dict[str, Any]) -> None:
        await stream.send_all(ws.send(Message(data=json.dumps(frame))))

    long = {"max_new_tokens": 300, "ignore_eos": True}
    for i in range(8):  # their deltas fill the queue to a client that reads nothing yet
        await send({"id": f"f{i}", "type": "generate", "text": "And", "sampling_params": long})
    await trio.sleep(1.5)
    one = {"max_new_tokens": 1, "ignore_eos": True}
    target = {"id": "t", "type": "generate", "text": "In", "sampling_params": one, "rid": how}
    await send(target)
    await trio.sleep(1.5)  # its one token is made, its delta waits behind the others
    made = True  # (an abort finds nothing to stop once the engine has made it)
    if how == "cancel":
        await send({"id": "t", "type": "cancel"})
    else:
        async with httpx.AsyncClient(base_url=default_server.url, timeout=30) as client:
            aborted = (await client.post("/abort_request", json={"rid": how})).json()
            assert aborted in ({"aborted": 0}, {"aborted": 1}), aborted
            made = aborted == {"aborted": 0}  # (1: a machine too slow for the sleep)
    received, done, text = 0, None, ""
    with trio.fail_after(60):
        while done is None:
            ws.receive_data(await stream.receive_some(65536))
            for event in ws.events():
                if isinstance(event, Message):
                    text += event.data
                    if not event.message_finished:
                        continue
                    frame, text = json.loads(text), ""
                    if frame["id"] == "t" and frame["type"] == "delta":
                        received += len(frame["output_ids"])
                    elif frame["id"] == "t":
                        done = frame
    assert done["type"] == "done", done
    meta = done["meta_info"]
    assert meta["completion_tokens"] == received
    assert meta["finish_reason"]["type"] == ("length" if received else "abort"), meta
    if how == "abort_request":  # made whole: its client gets it whole
        assert bool(received) == made, (received, made)
    await stream.aclose()


@pytest.mark.parametrize("how", ["cancel", "abort_request"])
async def test_a_cancel_while_paused_counts_its_prompt(default_server: Server, how: str) -> None:
    """Cancelled after its prompt was tokenized, before its first token (generation
    paused): its done frame had only an id and a finish_reason (no counts; with
    n > 1 no meta_infos), then said prompt_tokens 0. Aborted by /abort_request, its
    request's meta_info had no finish_reason (a cancel's had)."""
    body: dict[str, Any] = {"type": "generate", "text": "And God said unto Moses", "rid": how}
    body["sampling_params"] = {"max_new_tokens": 20, "n": 2}
    async with httpx.AsyncClient(base_url=default_server.url, timeout=30) as client:
        pause = await client.post("/pause_generation", json={"mode": "in_place"})
        assert pause.status_code == 200
        try:
            async with open_websocket_url(f"ws://127.0.0.1:{default_server.port}/ws") as ws:
                await ws.send_message(json.dumps({"id": "p", **body}))
                with trio.fail_after(30):  # in the paused scheduler: its prompt tokenized
                    while not (default_server.info()["scheduler"] or {}).get("requests"):
                        await trio.sleep(0.05)
                await trio.sleep(0.2)  # (the ids reach the front beside it, on another ring)
                if how == "cancel":
                    await ws.send_message(json.dumps({"id": "p", "type": "cancel"}))
                else:
                    aborted = await client.post("/abort_request", json={"rid": how})
                    assert aborted.json() == {"aborted": 1}, aborted.text
                frame = await receive(ws)
        finally:
            await client.post("/continue_generation")
    assert frame["type"] == "done", frame
    meta = frame["meta_info"]
    assert {"prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency"} <= set(meta)
    assert meta["finish_reason"]["type"] == "abort" and meta["prompt_tokens"] > 5
    assert [m["finish_reason"]["type"] for m in frame["meta_infos"]] == ["abort", "abort"]
    assert all(
        m["prompt_tokens"] == frame["meta_info"]["prompt_tokens"] for m in frame["meta_infos"]
    )

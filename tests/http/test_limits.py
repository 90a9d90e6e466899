"""The API key, body size limit, queue limit (503), auto-truncation, and a
client disconnecting mid-stream. One rt-serve with the null model (no
forward pass) and 20 ms scheduler steps, so requests stay in flight."""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio
from serverlib import SLOW_STEPS, Server, metrics, running_server, write_plan
from trio_websocket import open_websocket_url

from rt.http.app import ROUTES

KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY_LIMIT = 64 * 1024
BODY_TIMEOUT_S = 3  # the other tests here send their bodies at once


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    plan = write_plan(tmp_path_factory.mktemp("plan") / "slow.json", SLOW_STEPS)
    with running_server(
        "--load-format=null",
        f"--fault-plan={plan}",
        f"--api-key={KEY}",
        "--max-running-requests=2",
        "--max-queued-requests=2",
        f"--max-body-size={BODY_LIMIT}",
        f"--body-timeout={BODY_TIMEOUT_S}",
        "--allow-auto-truncate",
        "--ws-max-in-flight=2",
        '--allowed-origins=["https://ui.example"]',
    ) as s:
        yield s


def long_body(tokens: int, **extra: Any) -> dict[str, Any]:
    params = {"max_new_tokens": tokens, "ignore_eos": True}
    return {"text": "In the beginning", "sampling_params": params, **extra}


def test_api_key_on_every_endpoint_but_health(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/ping").status_code == 200  # (its alias, for load balancers)
        # every route the app has (pause and continue too, which a 401 keeps from running)
        calls = [key for key, route in ROUTES.items() if not route.open]
        calls += [("GET", "/v1/models/default"), ("GET", "/openapi.json")]
        assert ("POST", "/pause_generation") in calls and ("GET", "/flush_cache") in calls
        for method, path in calls:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                response = client.request(method, path, headers=headers, json={})
                assert response.status_code == 401, (method, path, headers)
                assert response.json()["error"]["code"] == "invalid_api_key"
        assert client.get("/v1/models", headers=AUTH).status_code == 200
        for scheme in ("bearer", "BEARER"):  # the scheme is case-insensitive (RFC 9110)
            headers = {"Authorization": f"{scheme} {KEY}"}
            assert client.get("/v1/models", headers=headers).status_code == 200
        assert (
            client.get("/v1/models", headers={"Authorization": f"Basic {KEY}"}).status_code == 401
        )
        body = {"prompt": "x", "max_tokens": 2}
        assert client.post("/v1/completions", json=body, headers=AUTH).status_code == 200


async def refused_handshake(port: int, headers: bytes) -> tuple[bytes, bytes]:
    """A /ws handshake the server refuses: its answer's head and body. By hand:
    trio-websocket's ConnectionRejected path leaves its socket open (a ResourceWarning)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            + headers
            + b"\r\n"
        )
        answer = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(4096):  # to EOF
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


async def test_api_key_on_the_websocket(server: Server) -> None:
    url = f"ws://127.0.0.1:{server.port}/ws"
    head, body = await refused_handshake(server.port, b"")
    assert head.startswith(b"HTTP/1.1 401"), head  # it was a bare 403
    assert b"www-authenticate: bearer" in head.lower()
    assert json.loads(body)["error"]["code"] == "invalid_api_key"
    async with open_websocket_url(url, extra_headers=[("Authorization", f"Bearer {KEY}")]) as ws:
        await ws.send_message(
            json.dumps(
                {"id": 1, "type": "generate", "text": "x", "sampling_params": {"max_new_tokens": 1}}
            )
        )
        while json.loads(await ws.get_message())["type"] != "done":
            pass
        await ws.send_message("x" * (BODY_LIMIT + 1))
        frame = json.loads(await ws.get_message())
        assert frame["type"] == "error" and frame["status"] == 413


async def test_a_websocket_holds_at_most_its_limit_of_generations(server: Server) -> None:
    url = f"ws://127.0.0.1:{server.port}/ws"
    async with open_websocket_url(url, extra_headers=[("Authorization", f"Bearer {KEY}")]) as ws:
        for cid, tokens in (("a", 30), ("b", 3), ("c", 3)):
            await ws.send_message(json.dumps({"id": cid, "type": "generate", **long_body(tokens)}))
        ends: list[tuple[str, Any]] = []
        with trio.fail_after(60):
            while len(ends) < 3:
                frame = json.loads(await ws.get_message())
                if frame["type"] != "delta":
                    ends.append((frame["id"], frame.get("status")))
                if ends == [("c", 429), ("b", None)]:  # room again: accepted
                    body = {"id": "d", "type": "generate", **long_body(3)}
                    await ws.send_message(json.dumps(body))
                    ends.append(("sent d", None))
            assert ends[:3] == [("c", 429), ("b", None), ("sent d", None)]
            while len(ends) < 5:
                frame = json.loads(await ws.get_message())
                if frame["type"] != "delta":
                    assert frame["type"] == "done", frame
                    ends.append((frame["id"], None))
        assert sorted(ends[3:]) == [("a", None), ("d", None)]


async def test_a_cancel_makes_room_for_a_generate_sent_right_after_it(server: Server) -> None:
    """At --ws-max-in-flight, a client that cancelled a request and at once sent
    another was refused (429) a third of the time: the cancelled one counted till
    it unwound. The new one waits for that end, as one reusing the id does."""
    url = f"ws://127.0.0.1:{server.port}/ws"
    async with open_websocket_url(url, extra_headers=[("Authorization", f"Bearer {KEY}")]) as ws:

        async def until_end_of(cid: str) -> dict[str, Any]:
            while True:
                frame = json.loads(await ws.get_message())
                if frame["id"] == cid and frame["type"] in ("done", "error"):
                    return frame

        await ws.send_message(json.dumps({"id": "keep", "type": "generate", **long_body(400)}))
        with trio.fail_after(60):
            for i in range(10):
                await ws.send_message(json.dumps({"id": f"c{i}", "type": "generate",
                                                  **long_body(400)}))  # fmt: skip
                while json.loads(await ws.get_message())["id"] != f"c{i}":
                    pass  # (its first delta: in flight, generating)
                await ws.send_message(json.dumps({"id": f"c{i}", "type": "cancel"}))
                await ws.send_message(json.dumps({"id": f"n{i}", "type": "generate",
                                                  **long_body(1)}))  # fmt: skip
                end = await until_end_of(f"n{i}")
                assert end["type"] == "done", (i, end)
            await ws.send_message(json.dumps({"id": "keep", "type": "cancel"}))
            await until_end_of("keep")


def test_body_over_the_limit_is_413(server: Server) -> None:
    body = {"text": "word " * (BODY_LIMIT // 4), "sampling_params": {"max_new_tokens": 1}}
    response = httpx.post(f"{server.url}/generate", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 413
    assert str(BODY_LIMIT) in response.json()["error"]["message"]


@pytest.mark.parametrize("expect", [False, True])
def test_a_body_declared_far_past_the_limit_is_413_at_once(server: Server, expect: bool) -> None:
    """Refused before a byte of it is read, and before the body timeout: with
    ``Expect: 100-continue`` a client holds its body back (hypercorn still says
    "100 Continue"), and a declared 2**63 bytes never come."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=BODY_TIMEOUT_S - 1) as sock:
        head = (
            "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Length: {2**63}\r\n"
            + ("Expect: 100-continue\r\n" if expect else "")
            + "\r\n"
        )
        sock.sendall(head.encode())  # and no body
        answer = b""
        while chunk := sock.recv(65536):  # to EOF, before the timeout: it closes
            answer += chunk
    assert b"HTTP/1.1 413 " in answer, answer
    assert b"connection: close" in answer.lower()
    assert f"accepts at most {BODY_LIMIT}".encode() in answer


def test_a_compressed_body_is_415_naming_its_encoding(server: Server) -> None:
    body = gzip.compress(json.dumps({"text": "hi"}).encode())
    headers = {**AUTH, "Content-Encoding": "gzip", "Content-Type": "application/json"}
    response = httpx.post(f"{server.url}/generate", content=body, headers=headers, timeout=30)
    assert response.status_code == 415, response.text
    assert "Content-Encoding 'gzip' is not supported" in response.json()["error"]["message"]
    assert response.headers["accept-encoding"] == "identity"
    plain = {**AUTH, "Content-Encoding": "identity"}
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    assert httpx.post(f"{server.url}/generate", json=body, headers=plain).status_code == 200


def test_a_body_that_stops_arriving_is_408_and_its_connection_closed(server: Server) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        head = (
            "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Length: 100\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"text": "he')  # and then nothing
        answer = b""
        while chunk := sock.recv(65536):  # to EOF: the server closes the connection
            answer += chunk
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 408 ", answer
    assert f"within {BODY_TIMEOUT_S} s (--body-timeout)".encode() in rest
    health = httpx.get(f"{server.url}/health", timeout=30)
    assert health.status_code == 200


def test_a_big_body_to_a_control_is_413_and_not_acted_on(
    server: Server,
) -> None:
    """Past what the server reads and drops, it refuses before it acts: a paused
    engine left by an answer that never came, and a drain held for it, once."""
    host, port = server.url.removeprefix("http://").split(":")
    size = 3 << 20
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        head = (
            "POST /pause_generation HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Length: {size}\r\n\r\n"
        )
        sock.sendall(head.encode())
        with contextlib.suppress(OSError):  # the server may close before it has it all
            sock.sendall(b" " * size)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"accepts at most 65536" in answer  # (the body /pause_generation's mode rides in)
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
    response = httpx.post(f"{server.url}/generate", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 200  # not paused


def test_a_prompt_over_the_context_is_truncated_when_allowed(server: Server) -> None:
    body = {"text": "word " * 600, "sampling_params": {"max_new_tokens": 4}}
    response = httpx.post(f"{server.url}/generate", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["meta_info"]["prompt_tokens"] <= 512 - 4
    ids = {"input_ids": [5] * 5000, "sampling_params": {"max_new_tokens": 4}}
    response = httpx.post(f"{server.url}/generate", json=ids, headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["meta_info"]["prompt_tokens"] == 512 - 4


async def test_past_the_queue_limit_503_and_the_accepted_are_unaffected(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=60) as client:
        outputs: list[Any] = []

        async def accepted() -> None:
            async with client.stream("POST", "/generate", json=long_body(60, stream=True)) as r:
                assert r.status_code == 200
                events = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
            outputs.append(json.loads(events[-2]))

        async with trio.open_nursery() as nursery:
            for _ in range(4):  # max_running_requests (2) + max_queued_requests (2)
                nursery.start_soon(accepted)
            with trio.fail_after(10):
                while (await client.get("/server_info")).json()["requests_in_flight"] < 4:
                    await trio.sleep(0.01)
            rejected = metrics(server)[REJECTED]
            refused = await client.post("/generate", json=long_body(4))
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert "queue limit" in refused.json()["error"]["message"]
            chat = await client.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
            )
            assert chat.status_code == 503
            two = await client.post("/generate", json={**long_body(4), "sampling_params": {"n": 2}})
            assert two.status_code == 503
            # three requests refused (one of two samples): three, as rt_requests_total says
            assert metrics(server)[REJECTED] == rejected + 3
        assert [len(o["output_ids"]) for o in outputs] == [60] * 4
        assert all(o["meta_info"]["finish_reason"]["type"] == "length" for o in outputs)
        assert (await client.post("/generate", json=long_body(2))).status_code == 200
        # more than the server ever holds: a 400, never a 503 to retry for ever
        batch = {"text": ["a", "b", "c", "d", "e"], "sampling_params": {"max_new_tokens": 1}}
        for body in (batch, {"text": "a", "sampling_params": {"max_new_tokens": 1, "n": 5}}):
            too_many = await client.post("/generate", json=body)
            assert too_many.status_code == 400, too_many.text
            assert "asks for 5 generations" in too_many.json()["error"]["message"]


REJECTED = "rt_rejected_requests_total{}"
CANCELLED = "rt_aborted_requests_total{cause=cancelled}"
PROMPT_TOKENS = "rt_prompt_tokens_total{}"
GENERATED = "rt_generation_tokens_total{}"
CHAT = [{"role": "user", "content": "In the beginning"}]
DISCONNECTS = {  # (path, body, whether it streams)
    "generate-stream": ("/generate", long_body(400, stream=True), True),
    "generate": ("/generate", long_body(400), False),
    "completions": (
        "/v1/completions",
        {"prompt": "x", "max_tokens": 400, "ignore_eos": True},
        False,
    ),
    "chat-stream": (
        "/v1/chat/completions",
        {"messages": CHAT, "max_tokens": 400, "ignore_eos": True, "stream": True},
        True,
    ),
}


@pytest.mark.parametrize("case", DISCONNECTS)
async def test_disconnect_frees_the_kv_at_once(server: Server, case: str) -> None:
    """A client that leaves, mid-stream or while it waits for a whole answer,
    cancels its request at once: not at its end, nor after a polling interval."""
    path, body, streams = DISCONNECTS[case]
    before = metrics(server)
    async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=60) as client:
        steps = (await client.get("/server_info")).json()["scheduler"]["steps"]
        # By hand: httpx leaves its inner async generators to the garbage collector
        # when a stream is left early (a ResourceWarning under trio).
        data = json.dumps(body).encode()
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        async with stream:
            await stream.send_all(
                b"POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (path.encode(), KEY.encode(), len(data), data)
            )
            received = b""
            with trio.fail_after(30):
                if streams:
                    while received.count(b"data: ") < 3:
                        received += await stream.receive_some(65536)
                    assert received.startswith(b"HTTP/1.1 200")
                else:  # nothing comes before the end: leave once the scheduler runs it
                    while (await client.get("/server_info")).json()["scheduler"]["running"] < 1:
                        await trio.sleep(0.05)
        left_at = trio.current_time()
        with trio.fail_after(10):  # the request alone would take 400 steps of 20 ms more
            while True:
                stats = (await client.get("/server_info")).json()["scheduler"]
                if stats["steps"] > steps and stats["running"] == 0:
                    break
                await trio.sleep(0.02)
        assert trio.current_time() - left_at < 4.0  # it had 6 s or more to go
        assert stats["request_tokens"] == 0  # its KV is free
        with trio.fail_after(10):  # (counted as its task unwinds)
            while (after := metrics(server)).get(CANCELLED) == before.get(CANCELLED):
                await trio.sleep(0.05)
        # what was made for it is counted (nothing was): its prompt, the tokens it was sent
        assert after[PROMPT_TOKENS] > before[PROMPT_TOKENS]
        assert after[GENERATED] >= before[GENERATED] + (2 if streams else 0)  # (chat: a role)


def test_a_chat_cut_to_the_context_gets_the_default_room_to_answer(server: Server) -> None:
    """No max_tokens is the room the prompt leaves; when the server must cut the
    prompt, the engine's default of 128 (it was 1 token, the room a whole-context
    prompt leaves)."""
    body = {"messages": [{"role": "user", "content": "word " * 600}], "ignore_eos": True, "n": 2}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 2 * 128
    assert answer.json()["usage"]["prompt_tokens"] == 512 - 128


def test_echo_gives_the_prompt_the_model_read_when_the_server_cut_it(server: Server) -> None:
    """With --allow-auto-truncate, echo is the end of the prompt that was kept,
    as vLLM's: its tokens and offsets then match its text (it was the whole
    prompt, beside the kept tokens' logprobs and offsets)."""
    prompt = " ".join(str(i) for i in range(400))
    body = {"prompt": prompt, "max_tokens": 4, "echo": True, "logprobs": 0, "ignore_eos": True}
    url = f"{server.url}/v1/completions"
    answer = httpx.post(url, json=body, headers=AUTH, timeout=30).json()
    with httpx.stream("POST", url, json={**body, "stream": True}, headers=AUTH) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    streamed = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    text, used = answer["choices"][0]["text"], answer["usage"]["prompt_tokens"]
    kept = text[: text.rindex("399") + 3]
    assert prompt.endswith(kept) and 100 < len(kept) < len(prompt)
    assert streamed.startswith(kept) and not streamed.startswith(prompt[:10])
    logprobs = answer["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == used + 4
    assert "".join(logprobs["tokens"][:used]) == kept
    assert logprobs["text_offset"][used] == len(kept)


PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


def test_a_browser_page_may_call_from_an_allowed_origin_only(server: Server) -> None:
    """CORS: a preflight needs no key (a browser sends none with it); the answer,
    a 401 included, carries the origin so that the page can read it."""
    url = f"{server.url}/v1/chat/completions"
    ok = httpx.options(url, headers={"Origin": "https://ui.example", **PREFLIGHT})
    assert ok.status_code == 200, ok.text
    assert ok.headers["access-control-allow-origin"] == "https://ui.example"
    assert "authorization" in ok.headers["access-control-allow-headers"].lower()
    refused = httpx.options(url, headers={"Origin": "https://evil.example", **PREFLIGHT})
    assert refused.status_code == 400
    assert "access-control-allow-origin" not in refused.headers
    error = refused.json()["error"]  # as every error (it was Starlette's plain text)
    assert error["type"] == "invalid_request_error" and "Disallowed CORS origin" in error["message"]
    for headers, status in (({}, 401), (AUTH, 200)):
        answer = httpx.get(
            f"{server.url}/v1/models", headers={"Origin": "https://ui.example", **headers}
        )
        assert answer.status_code == status
        assert answer.headers["access-control-allow-origin"] == "https://ui.example"


def test_any_origin_by_default_as_vllm_and_sglang(default_server: Server) -> None:
    url = f"{default_server.url}/v1/completions"
    preflight = httpx.options(url, headers={"Origin": "http://localhost:3000", **PREFLIGHT})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "*"
    body = {"prompt": "In the", "max_tokens": 2}
    answer = httpx.post(url, json=body, headers={"Origin": "http://localhost:3000"}, timeout=30)
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "*"
    plain = httpx.post(url, json=body, timeout=30)  # no Origin: no CORS headers
    assert "access-control-allow-origin" not in plain.headers


async def test_a_page_from_another_origin_may_not_open_the_websocket(server: Server) -> None:
    """CORS does not cover WebSockets (a browser opens one from any page): the
    handshake's Origin is checked against --allowed-origins."""
    key = f"Authorization: Bearer {KEY}\r\n".encode()
    head, body = await refused_handshake(server.port, key + b"Origin: https://evil.example\r\n")
    assert head.startswith(b"HTTP/1.1 403"), head
    assert "--allowed-origins" in json.loads(body)["error"]["message"]
    url = f"ws://127.0.0.1:{server.port}/ws"
    for origin in ([("Origin", "https://ui.example")], []):  # the page allowed; no browser
        async with open_websocket_url(url, extra_headers=[*origin, *AUTH.items()]) as ws:
            body = {
                "id": 1,
                "type": "generate",
                "text": "x",
                "sampling_params": {"max_new_tokens": 1},
            }
            await ws.send_message(json.dumps(body))
            while json.loads(await ws.get_message())["type"] != "done":
                pass


async def test_a_websocket_message_far_past_the_limit_closes_the_connection(server: Server) -> None:
    # hypercorn holds a message whole before the app sees it: it held up to 64 MiB each
    # (six half-sent ones: 355 MB, for good). Past the limit and 1 MiB, it closes (1009).
    # By hand: trio-websocket leaves its socket open after such a close (a ResourceWarning).
    size = BODY_LIMIT + (1 << 20) + 1
    frame = b"\x81\xff" + size.to_bytes(8, "big") + b"\0\0\0\0" + b"x" * size  # masked by 0
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    async with stream:
        await stream.send_all(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            + f"Authorization: Bearer {KEY}\r\n\r\n".encode()
        )
        answer = b""
        with trio.fail_after(30):
            while b"\r\n\r\n" not in answer:
                answer += await stream.receive_some(4096)
            with contextlib.suppress(trio.BrokenResourceError):  # closed while we still sent
                await stream.send_all(frame)
            while len(answer.partition(b"\r\n\r\n")[2]) < 4:  # the close frame's code
                answer += await stream.receive_some(4096)
    head, _, frames = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    assert frames[:1] == b"\x88" and int.from_bytes(frames[2:4], "big") == 1009, frames[:40]

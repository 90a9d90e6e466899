"""The exchange's edges over a real socket: a finished ``Connection: close``
stream closes (Starlette's streaming response on hypercorn's trio worker leaves
it open), and a request whose body the server did not need still leaves the
connection usable or closes it, never answering the next request with nothing."""

from __future__ import annotations

import json

import trio
from serverlib import Server


async def exchange(server: Server, raw: bytes) -> bytes:
    """Send ``raw``, read until the server closes the connection."""
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    async with stream:
        await stream.send_all(raw)
        received = b""
        with trio.fail_after(30):
            while chunk := await stream.receive_some(65536):
                received += chunk
    return received


def post(path: str, body: dict[str, object], *headers: str) -> bytes:
    data = json.dumps(body).encode()
    head = "".join(f"{h}\r\n" for h in headers)
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n{head}\r\n"
    ).encode() + data


async def test_a_finished_stream_closes_a_connection_close_connection(
    default_server: Server,
) -> None:
    body = {"text": "In the", "stream": True, "sampling_params": {"max_new_tokens": 4}}
    received = await exchange(default_server, post("/generate", body, "Connection: close"))
    assert received.startswith(b"HTTP/1.1 200")
    assert b"data: [DONE]" in received


async def test_an_error_before_the_body_is_read_keeps_the_connection_in_step(
    default_server: Server,
) -> None:
    # A 404 for a request with a body, then a good request on the same connection.
    first = post("/nope", {"x": 1})
    second = post(
        "/generate", {"text": "In", "sampling_params": {"max_new_tokens": 1}}, "Connection: close"
    )
    received = await exchange(default_server, first + second)
    assert received.startswith(b"HTTP/1.1 404")
    assert received.count(b"HTTP/1.1 200") == 1

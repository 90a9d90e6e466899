"""rt-serve and the clients that would take its file descriptors: idle
WebSocket connections, as many as a client likes. By default the server
takes only as many connections as leave the engine a spare of fds
(``--max-connections``); the others get 503 at once, and an actor killed
meanwhile comes back at once. With no cap (``--max-connections=0``) every
fd of the main process can be taken: before, an actor's restart then raised
OSError (no socketpair, no pidfd, no /dev/null for Popen) out of the
supervisor, and the whole server exited 1. Now the start is tried again,
uncounted, until fds come back."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from serverlib import Server, running_server
from trio_websocket import open_websocket_url

pytestmark = pytest.mark.skipif(shutil.which("prlimit") is None, reason="no prlimit")

LIMIT = 160  # rt-serve idles at ~50 fds
UPGRADE = (
    b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fill(port: int, count: int) -> list[socket.socket]:
    """Connections that each ask for a WebSocket and then sit idle: the server
    holds each it accepts; the rest wait in its backlog for an fd to come free."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(UPGRADE)
        socks.append(sock)
    return socks


async def health(client: httpx.AsyncClient) -> tuple[int, str]:
    r = await client.get("/health")
    return r.status_code, r.json().get("reason", "")


async def test_an_actor_killed_while_out_of_fds_comes_back_once_clients_leave() -> None:
    with running_server("--max-connections=0", fd_limit=LIMIT) as server:
        await restart_while_out_of_fds(server)


@asynccontextmanager
async def kept_client(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    """One connection, opened before a fill and kept alive by polling (< 5 s apart)."""
    limits = httpx.Limits(max_connections=1, keepalive_expiry=60)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
        assert await health(client) == (200, "")
        yield client


async def restart_while_out_of_fds(server: Server) -> None:
    pid = server.proc.pid
    async with kept_client(server) as client:
        fillers = fill(server.port, 2 * LIMIT)
        try:
            with trio.fail_after(30):
                while open_fds(pid) < LIMIT - 1:
                    await trio.sleep(0.2)
            os.kill(server.pids["tokenizer0"], signal.SIGKILL)
            with trio.fail_after(30):
                while "Too many open files" not in (status := await health(client))[1]:
                    await trio.sleep(0.3)
            assert status[0] == 503
            assert "tokenizer0 is restarting" in status[1]
            await trio.sleep(3)  # tries that fail meanwhile are not counted to an escalation
            assert server.proc.poll() is None, "\n".join(server.log[-30:])
        finally:
            for sock in fillers:
                sock.close()
        start = time.monotonic()
        with trio.fail_after(30):
            while (await health(client))[0] != 200:
                await trio.sleep(0.3)
        back_after = time.monotonic() - start
        params = {"max_new_tokens": 3, "ignore_eos": True}
        r = await client.post("/generate", json={"text": "Hi", "sampling_params": params})
        assert r.status_code == 200, r.text
        assert r.json()["meta_info"]["completion_tokens"] == 3
    actors = {a["name"]: a for a in server.info()["actors"]}
    # one kill, one restart, however many tries it took (each said why it failed)
    assert actors["tokenizer0"]["restart_count"] == 1
    assert actors["scheduler"]["restart_count"] == actors["detokenizer"]["restart_count"] == 0
    assert back_after < 15  # (the backoff's longest wait is 5 s)
    # trio's accept loop failed every 0.1 s meanwhile: said once in 10 s, without a traceback
    accept_failures = [line for line in server.log if "trio.serve_listeners" in line]
    assert 1 <= len(accept_failures) <= 3, accept_failures
    assert not [line for line in server.log if "Traceback" in line]


def stop_reading(port: int) -> socket.socket:
    """A streaming /generate whose client never reads: 8 prompts of big events
    (20 top logprobs each) fill a small receive buffer and the server's at once."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(("127.0.0.1", port))
    params = {"max_new_tokens": 400, "ignore_eos": True}
    data = json.dumps(
        {
            "text": ["In the beginning"] * 8,
            "sampling_params": params,
            "stream": True,
            "return_logprob": True,
            "top_logprobs_num": 20,
            "return_text_in_logprobs": True,
        }
    ).encode()
    head = f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n"
    sock.sendall(head.encode() + data)
    return sock


async def test_a_client_that_stops_reading_is_cut_while_the_server_is_out_of_fds() -> None:
    """--send-timeout finds a stuck client's connection by a scan of /proc/self/fd,
    which takes an fd of its own: at the limit that raised EMFILE out of the
    server (exit 1), just when cutting the client would give an fd back."""
    with running_server(
        "--load-format=null", "--send-timeout=2", "--max-connections=0", fd_limit=LIMIT
    ) as server:
        stuck = stop_reading(server.port)
        fillers: list[socket.socket] = []
        try:
            with trio.fail_after(30):
                while not server.info()["requests_in_flight"]:
                    await trio.sleep(0.1)
            fillers = fill(server.port, 2 * LIMIT)
            with trio.fail_after(30):
                while not [line for line in server.log if "(--send-timeout)" in line]:
                    assert server.proc.poll() is None, "\n".join(server.log[-30:])
                    await trio.sleep(0.2)
            await trio.sleep(2)  # passes after the cut, still out of fds
            assert server.proc.poll() is None, "\n".join(server.log[-30:])
        finally:
            for sock in [stuck, *fillers]:
                sock.close()
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            with trio.fail_after(30):
                while (await client.get("/health")).status_code != 200:
                    await trio.sleep(0.3)
        assert server.info()["requests_in_flight"] == 0
    assert not [line for line in server.log if "Traceback" in line]


def answer_of(sock: socket.socket) -> bytes:
    """What the server sent on a connection, to its end."""
    sock.settimeout(10)
    answer = b""
    while chunk := sock.recv(4096):
        answer += chunk
    return answer


async def test_past_max_connections_new_ones_get_503_and_the_open_ones_go_on() -> None:
    with running_server("--load-format=null", "--max-connections=4") as server:
        async with kept_client(server) as client:  # its connection: 1 of 4
            async with open_websocket_url(f"ws://127.0.0.1:{server.port}/ws") as ws:  # 2 of 4
                for _ in range(5):  # opened and closed: their places come back at once
                    socket.create_connection(("127.0.0.1", server.port)).close()
                await trio.sleep(0.5)  # (hypercorn held each for its keep-alive timeout, 5 s)
                fillers = fill(server.port, 2)  # 4 of 4
                for sock in fillers:
                    sock.settimeout(10)
                    assert sock.recv(12, socket.MSG_PEEK) == b"HTTP/1.1 101"
                try:
                    # a fifth: answered 503 before its request is read, and closed
                    with socket.create_connection(("127.0.0.1", server.port)) as extra:
                        extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                        head, _, body = answer_of(extra).partition(b"\r\n\r\n")
                    assert head.startswith(b"HTTP/1.1 503"), head
                    assert b"retry-after: 1" in head.lower()
                    message = json.loads(body)["error"]["message"]
                    assert "--max-connections 4" in message, message
                    with socket.create_connection(("127.0.0.1", server.port)) as extra:
                        extra.sendall(UPGRADE)  # a WebSocket's handshake: refused alike
                        assert answer_of(extra).startswith(b"HTTP/1.1 503")
                    # the connections taken go on: a generation on each
                    await ws.send_message(
                        json.dumps(
                            {"id": 1, "type": "generate", "text": "Hi",
                             "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
                        )
                    )  # fmt: skip
                    while (frame := json.loads(await ws.get_message()))["type"] != "done":
                        assert frame["type"] == "delta", frame
                    assert frame["meta_info"]["completion_tokens"] == 4
                    r = await client.post(
                        "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 3}}
                    )
                    assert r.json()["meta_info"]["completion_tokens"] == 3
                finally:
                    for sock in fillers:
                        sock.close()
            # the room they left is taken again
            with trio.fail_after(10):
                async with httpx.AsyncClient(base_url=server.url, timeout=10) as other:
                    while (r := await other.get("/metrics")).status_code != 200:
                        await trio.sleep(0.1)
            metrics = {
                family.name: family.samples[0].value
                for family in text_string_to_metric_families(r.text)
                if family.name.startswith("rt_http_")
            }
            assert metrics["rt_http_max_connections"] == 4
            assert metrics["rt_http_connections_refused"] >= 2
            assert 1 <= metrics["rt_http_connections"] <= 4
    assert not [line for line in server.log if "Traceback" in line]


async def test_clients_cannot_take_the_fds_an_actor_needs_to_come_back() -> None:
    """By default (no --max-connections): the same fill as above, and the
    tokenizer killed comes back at once, while the fill still holds every
    connection it was given."""
    with running_server(fd_limit=LIMIT) as server:
        pid = server.proc.pid
        async with kept_client(server) as client:
            fillers = fill(server.port, 2 * LIMIT)
            try:
                await trio.sleep(2)  # every filler is taken or refused by now
                answered = [s for s in fillers if select.select([s], [], [], 0)[0]]
                heads = [s.recv(12, socket.MSG_PEEK) for s in answered]
                assert heads.count(b"HTTP/1.1 101") < LIMIT // 2
                assert heads.count(b"HTTP/1.1 503") > LIMIT // 2, "the cap refused too few"
                assert open_fds(pid) < LIMIT - 16
                os.kill(server.pids["tokenizer0"], signal.SIGKILL)
                with trio.fail_after(30):
                    while (status := await health(client))[0] != 200:
                        assert "Too many open files" not in status[1], status
                        await trio.sleep(0.3)
                r = await client.post(
                    "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 3}}
                )
                assert r.status_code == 200, r.text
            finally:
                for sock in fillers:
                    sock.close()
        actors = {a["name"]: a for a in server.info()["actors"]}
    assert actors["tokenizer0"]["restart_count"] == 1
    assert not [line for line in server.log if "Too many open files" in line]
    assert not [line for line in server.log if "Traceback" in line]

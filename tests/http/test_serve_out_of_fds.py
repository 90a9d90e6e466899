"""rt-serve out of file descriptors: every fd of the main process taken by
idle WebSocket connections (a client can open as many as ``ulimit -n``
allows). Before, an actor's restart then raised OSError (no socketpair, no
pidfd, no /dev/null for Popen) out of the supervisor, and the whole server
exited 1. Now the start is tried again, uncounted, until fds come back."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time

import httpx
import pytest
import trio
from serverlib import Server, running_server

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
    with running_server(fd_limit=LIMIT) as server:
        await restart_while_out_of_fds(server)


async def restart_while_out_of_fds(server: Server) -> None:
    pid = server.proc.pid
    # one connection, opened before the fill and kept alive by polling (< 5 s apart)
    limits = httpx.Limits(max_connections=1, keepalive_expiry=60)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
        assert await health(client) == (200, "")
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
        r = await client.post(
            "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 3}}
        )
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
    with running_server("--load-format=null", "--send-timeout=2", fd_limit=LIMIT) as server:
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

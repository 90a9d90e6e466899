"""``--send-timeout``: a client that stops reading but keeps its connection open
is cut once it has taken nothing of a waiting write for that long, and its
generations are aborted; one that reads, with pauses shorter than that or
slowly through a write that lasts longer, is served to the end.
One rt-serve with the null model. Events carry 20 top logprobs each, so that
the kernel's buffers (megabytes on loopback) fill within a second."""

from __future__ import annotations

import json
import random
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from serverlib import Server, running_server, write_plan
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage

SEND_TIMEOUT_S = 3.0
TOKENS = 400
BIG_EVENTS = {"return_logprob": True, "top_logprobs_num": 20, "return_text_in_logprobs": True}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server("--load-format=null", f"--send-timeout={SEND_TIMEOUT_S}") as s:
        yield s


def body(prompts: int) -> dict[str, Any]:
    params = {"max_new_tokens": TOKENS, "ignore_eos": True}
    return {"text": ["In the beginning"] * prompts, "sampling_params": params, **BIG_EVENTS}


def post_stream(
    port: int, payload: dict[str, Any], rcvbuf: int | None = None, http: str = "1.1"
) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    data = json.dumps({"stream": True, **payload}).encode()
    head = f"POST /generate HTTP/{http}\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n"
    sock.sendall(head.encode() + data)
    return sock


def in_flight(server: Server) -> int:
    return int(server.info()["requests_in_flight"])


def all_in_flight(server: Server, n: int) -> bool:
    """Whether ``n`` requests come to be in flight (soon: the machine may be busy)."""
    deadline = time.monotonic() + 20
    while in_flight(server) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return in_flight(server) == n


def wait_idle(server: Server, within_s: float) -> float:
    """Seconds until nothing is in flight; fails past ``within_s``."""
    start = time.monotonic()
    while in_flight(server):
        assert time.monotonic() - start < within_s, f"{in_flight(server)} still in flight"
        time.sleep(0.1)
    return time.monotonic() - start


def cut_lines(server: Server) -> list[str]:
    return [line for line in server.log if "(--send-timeout)" in line]


def ended(sock: socket.socket) -> bool:
    """Whether the server has closed the connection (reading what it had sent)."""
    sock.settimeout(10)
    try:
        while sock.recv(1 << 20):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def read_to_end(sock: socket.socket, every_s: float, at_most: int | None = None) -> bytes:
    """Every ``every_s``, what has arrived (up to ``at_most`` bytes), until the
    server closes; then the socket is closed."""
    data = bytearray()
    start = time.monotonic()
    try:
        sock.setblocking(False)
        while True:
            time.sleep(every_s)
            try:
                while chunk := sock.recv(at_most or 1 << 20):
                    data += chunk
                    if at_most:
                        break
                else:
                    return bytes(data)
            except BlockingIOError:
                pass
            assert time.monotonic() - start < 120, len(data)
    finally:
        sock.close()


def test_an_sse_client_that_stops_reading_is_cut_and_its_generations_aborted(
    server: Server,
) -> None:
    """The write to it waited for good, shielded by hypercorn: the stream's eight
    generations (and their KV) stayed in flight as long as the client stayed."""
    before = len(cut_lines(server))
    sock = post_stream(server.port, body(8), rcvbuf=2048)
    try:
        assert all_in_flight(server, 8)
        took = wait_idle(server, within_s=SEND_TIMEOUT_S + 20)
        assert took > SEND_TIMEOUT_S - 1.5, took  # not before its writes had waited
        assert ended(sock)
    finally:
        sock.close()
    assert len(cut_lines(server)) == before + 1, server.log[-5:]


def test_a_websocket_client_that_stops_reading_is_cut_and_its_generations_aborted(
    server: Server,
) -> None:
    before = len(cut_lines(server))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(("127.0.0.1", server.port))
    ws = WSConnection(ConnectionType.CLIENT)
    try:
        sock.sendall(ws.send(Request(host="127.0.0.1", target="/ws")))
        while not any(isinstance(e, AcceptConnection) for e in ws.events()):
            ws.receive_data(sock.recv(65536))
        # 32 generations: their deltas (0.33 MB each) are more than twice what the
        # server's socket can hold (4 MiB at most); 4, and at times 12, fitted, ran to
        # their end and were not cut
        for i in range(32):
            frame = {"id": i, "type": "generate", **body(1), "text": "In the beginning"}
            sock.sendall(ws.send(TextMessage(data=json.dumps(frame))))
        assert all_in_flight(server, 32)
        wait_idle(server, within_s=SEND_TIMEOUT_S + 20)
        assert ended(sock)
    finally:
        sock.close()
    assert len(cut_lines(server)) == before + 1, server.log[-5:]


def test_a_client_that_pauses_for_less_than_the_timeout_is_served_to_the_end(
    server: Server,
) -> None:
    """Each pause holds the server's writes nearly as long as the timeout; the
    stream as a whole takes several times the timeout. A bound on the stream,
    or on how long the client has been behind, would cut it. (Measured: from
    the second pause on, each drain read ~2 MB, the kernel's buffers full:
    the server's writes had been waiting on the client.)"""
    before = len(cut_lines(server))
    sock = post_stream(server.port, body(32), http="1.0")  # not chunked; the end is EOF
    start = time.monotonic()
    # the server fills the buffers, and waits; 1 MiB a pause: ~7 pauses for the ~7 MB
    # (draining all that had come, a machine whose buffers had grown took 3 pauses)
    data = read_to_end(sock, every_s=SEND_TIMEOUT_S / 2, at_most=1 << 20)
    took = time.monotonic() - start
    events = [json.loads(e[6:]) for e in data.decode().split("\n\n") if e.startswith("data: {")]
    finished = [e for e in events if e["meta_info"].get("finish_reason")]
    assert len(finished) == 32, events[-1]
    assert all(e["meta_info"]["finish_reason"]["type"] == "length" for e in finished)
    assert took > 2 * SEND_TIMEOUT_S, (
        f"took {took:.1f} s, {len(data)} bytes: the test held the server back too little"
    )
    assert len(cut_lines(server)) == before


def test_a_slow_reader_of_one_big_answer_is_served_to_the_end(server: Server) -> None:
    """A non-streamed answer is one write: to a client that reads it slowly but
    steadily, it waits longer than the timeout, the client's TCP taking bytes all
    along. A bound on the write alone would cut it."""
    before = len(cut_lines(server))
    sock = post_stream(server.port, {**body(32), "stream": False}, http="1.0")
    sock.settimeout(60)
    data = sock.recv(1 << 16)  # waits out the generation
    first = time.monotonic()
    data += read_to_end(sock, every_s=0.1, at_most=96 << 10)  # ~1 MB/s
    took = time.monotonic() - first
    head, _, answer = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert answer.startswith(b"["), (len(data), head, answer[:200])
    results = json.loads(answer)
    assert [r["meta_info"]["completion_tokens"] for r in results] == [TOKENS] * 32
    assert took > SEND_TIMEOUT_S + 1, f"took {took:.1f} s, {len(data)} bytes: too fast to tell"
    assert len(cut_lines(server)) == before


def test_a_client_that_stops_reading_holds_no_room_once_its_generation_ended() -> None:
    """Past --max-running-requests + --max-queued-requests, a request is a 503. Room
    was freed when the client had read its answer, not when the engine had made
    it: clients that stopped reading kept everyone out with 503s, the engine idle,
    until --send-timeout cut them."""
    with running_server(
        "--load-format=null",
        "--send-timeout=60",
        "--max-running-requests=2",
        "--max-queued-requests=1",
    ) as server:
        stuck = [post_stream(server.port, body(1), rcvbuf=4096) for _ in range(3)]
        try:
            deadline = time.monotonic() + 60
            while True:  # the engine is done with them, their clients are not
                info = server.info()
                scheduler = info["scheduler"] or {}
                done = scheduler.get("steps") and not scheduler["running"]
                if done and not scheduler["waiting"] and info["requests_in_flight"] == 3:
                    break
                assert time.monotonic() < deadline, info
                time.sleep(0.1)
            short = {"text": "x", "sampling_params": {"max_new_tokens": 2}}
            answer = httpx.post(f"{server.url}/generate", json=short, timeout=30)
            assert answer.status_code == 200, answer.text
            assert server.info()["requests_in_flight"] == 3  # still not read
            # nor are they running, or waiting, in /metrics: the engine is done with them
            gauges = metrics(server)
            assert gauges["rt_num_running_reqs"] == gauges["rt_num_queue_reqs"] == 0, gauges
        finally:
            for sock in stuck:
                sock.close()
        deadline = time.monotonic() + 30
        while server.info()["requests_in_flight"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # their clients left before reading it all, but no generation was cut short
        assert metrics(server).get('rt_aborted_requests_total{cause="cancelled"}', 0) == 0


def test_a_drain_says_when_it_waits_for_answers_not_requests() -> None:
    """A stop while a client that stopped reading still holds its finished answer
    logged "draining 0 request(s)", then waited the drain out: it says what it
    waits for."""
    with running_server("--load-format=null", "--drain-timeout=2") as server:
        stuck = post_stream(server.port, body(1), rcvbuf=4096)
        try:
            deadline = time.monotonic() + 60
            while True:  # the engine is done with it, its client is not
                info = server.info()
                scheduler = info["scheduler"] or {}
                done = scheduler.get("steps") and not scheduler["running"] + scheduler["waiting"]
                if done and info["requests_in_flight"] == 1:
                    break
                assert time.monotonic() < deadline, info
                time.sleep(0.1)
            assert server.stop(signal.SIGTERM) == 0
        finally:
            stuck.close()
    said = [line for line in server.log if "draining" in line]
    assert said and "no request in flight (answers clients are still taking" in said[0], said


def metrics(server: Server) -> dict[str, float]:
    """/metrics' samples without labels, and rt_aborted_requests_total's."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    samples = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name and not name.startswith("#") and ("{" not in name or "aborted" in name):
            samples[name] = float(value)
    return samples


async def test_an_abort_at_a_streams_first_token_still_ends_its_response(server: Server) -> None:
    """Streamed chats aborted (/abort_request) 0-20 ms after they are sent, many at
    once: an abort that landed inside hypercorn's write of the status line, after the
    write and before hypercorn's state moved on, broke the connection (6% of them,
    RemoteProtocolError, an ERROR logged). Each ends its response now: a 200 whose
    events end with [DONE], or a 4xx before it began."""
    rng = random.Random(3)
    broken: list[str] = []
    ended = 0

    async def one(client: httpx.AsyncClient, rid: str) -> None:
        nonlocal ended
        chat = {"messages": [{"role": "user", "content": "And God said"}], "max_tokens": 64}
        try:
            async with client.stream(
                "POST", "/v1/chat/completions", json={**chat, "stream": True, "rid": rid}
            ) as response:
                lines = [line async for line in response.aiter_lines() if line]
            if response.status_code == 200 and lines[-1] != "data: [DONE]":
                broken.append(f"{rid}: ended with {lines[-1]!r}")
            ended += 1
        except httpx.HTTPError as err:
            broken.append(f"{rid}: {type(err).__name__}: {err}")

    async def worker(k: int) -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            for i in range(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(one, client, f"a{k}-{i}")
                    await trio.sleep(rng.uniform(0, 0.02))
                    await client.post("/abort_request", json={"rid": f"a{k}-{i}"})

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for k in range(8):
                nursery.start_soon(worker, k)
    assert not broken and ended == 480, broken[:5]


def queued_to(server_port: int, sock: socket.socket) -> int:
    """The bytes the server's end of ``sock``'s connection holds unsent (/proc/net/tcp)."""
    ends = {f"0100007F:{server_port:04X}", f"0100007F:{sock.getsockname()[1]:04X}"}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, _, queues = line.split()[1:5]
        if {local, remote} == ends and local.endswith(f":{server_port:04X}"):
            return int(queues.split(":")[0], 16)
    return 0


def test_an_abort_stops_the_generations_of_a_client_that_stopped_reading(tmp_path: Path) -> None:
    """/abort_request of a stream whose client stopped reading: the stream's reader
    waited in its write (hypercorn shields it) and saw the abort only after it, so
    the engine generated on to max_new_tokens, until --send-timeout cut the client
    (60 s by default). The abort stops the engine at once now."""
    slow = {"seed": 1, "faults": [{"actor": "scheduler", "point": "step", "action": "delay",
                                   "delay_ms": 40, "times": 0}]}  # fmt: skip
    plan = write_plan(tmp_path / "slow.json", slow)
    with running_server(
        "--load-format=null", f"--fault-plan={plan}", "--send-timeout=60"
    ) as server:
        payload = {**body(64), "rid": "stuck"}
        payload["sampling_params"]["max_new_tokens"] = 480  # ~20 s of 40 ms steps
        sock = post_stream(server.port, payload, rcvbuf=2048, http="1.0")  # (the end: EOF)
        try:
            assert all_in_flight(server, 64)
            deadline, last = time.monotonic() + 30, -1
            while (queued := queued_to(server.port, sock)) == 0 or queued != last:
                assert time.monotonic() < deadline, "the server's writes never waited"
                last = queued
                time.sleep(0.5)  # (full and unchanged: its write waits on the client)
            answer = httpx.post(f"{server.url}/abort_request", json={"rid": "stuck"}, timeout=30)
            assert answer.json() == {"aborted": 64}, answer.text
            # aborted already, though still in flight: not counted again (it was, each time)
            again = httpx.post(f"{server.url}/abort_request", json={"abort_all": True}, timeout=30)
            assert again.json() == {"aborted": 0}, again.text
            aborted = time.monotonic()
            while (server.info()["scheduler"] or {}).get("running"):
                # (the engine without the abort: the ~15 s of steps left)
                assert time.monotonic() - aborted < 8, "the engine generated on"
                time.sleep(0.1)
            data = read_to_end(sock, every_s=0.05)  # the client reads again: its answer
        finally:  # ends, each prompt's marked aborted
            sock.close()
        ends = finish_reasons(data)
        assert len(ends) == 64 and all(end["type"] == "abort" for end in ends), ends[:3]
        assert data.endswith(b"data: [DONE]\n\n"), data[-100:]

        # made whole by the engine, not yet read by its client: nothing left to abort
        # (it was counted aborted, and its client told so of the tokens it had made)
        payload = {**body(64), "rid": "made"}
        payload["sampling_params"]["max_new_tokens"] = 48  # ~2 s of 40 ms steps
        steps = server.info()["scheduler"]["steps"]
        sock = post_stream(server.port, payload, rcvbuf=2048, http="1.0")
        try:
            assert all_in_flight(server, 64)
            deadline = time.monotonic() + 30
            while not idle(info := server.info(), after=steps + 48):
                assert time.monotonic() < deadline, info
                time.sleep(0.1)
            assert info["requests_in_flight"] == 64, "the client took all: nothing tested"
            answer = httpx.post(f"{server.url}/abort_request", json={"rid": "made"}, timeout=30)
            assert answer.json() == {"aborted": 0}, answer.text
            data = read_to_end(sock, every_s=0.05)
        finally:
            sock.close()
        ends = finish_reasons(data)
        assert len(ends) == 64 and all(end["type"] == "length" for end in ends), ends[:3]
        assert data.endswith(b"data: [DONE]\n\n"), data[-100:]


def idle(info: dict[str, Any], after: int = 1) -> bool:
    """Whether /server_info's scheduler has run ``after`` steps and holds no request."""
    scheduler = info["scheduler"] or {}
    return scheduler.get("steps", 0) >= after and not scheduler["running"] + scheduler["waiting"]


def finish_reasons(data: bytes) -> list[dict[str, Any]]:
    """The finish reasons of an SSE answer of /generate's, as its events end."""
    events = [json.loads(e[6:]) for e in data.decode().split("\n\n") if e.startswith("data: {")]
    return [e["meta_info"]["finish_reason"] for e in events if e["meta_info"]["finish_reason"]]

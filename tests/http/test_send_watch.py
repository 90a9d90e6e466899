"""rt/http/send_watch.py's pass over real loopback connections, at given times:
a write that waits is cut only after ``timeout_s`` without the client's TCP
taking anything, however long the write itself has waited."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio
import trio.testing

from rt.http.send_watch import SendWatch

TIMEOUT_S = 10.0
EVERY_S = 1.0


@contextmanager
def connection() -> Iterator[tuple[int, socket.socket, socket.socket]]:
    """(port, the client's end, the server's end) of one loopback connection
    whose buffers are full: the server's next write would wait."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        server, _ = listener.accept()
    with client, server:
        server.setblocking(False)
        fill(server)
        yield port, client, server


def fill(sock: socket.socket) -> None:
    try:
        while True:
            sock.send(b"x" * 65536)
    except BlockingIOError:
        pass


def take(client: socket.socket, server: socket.socket) -> None:
    """The client reads what has come, and its TCP acknowledges it; the server
    fills the buffers again (its write waits on)."""
    client.settimeout(0.2)
    got = 0
    try:
        while True:
            got += len(client.recv(1 << 20))
    except TimeoutError:
        pass
    assert got > 0
    fill(server)


def cut(server: socket.socket) -> bool:
    try:
        fill(server)  # (the client's reads may have made room)
        server.send(b"x")
    except BlockingIOError:
        return False
    except OSError:  # EPIPE: shut down
        return True
    return False


async def waiting_write(watch: SendWatch, server: socket.socket, nursery: trio.Nursery) -> Any:
    """A write to ``server``'s client that waits (as hypercorn's does) until released."""
    released = trio.Event()

    async def send(message: Any) -> None:
        await released.wait()

    timed = watch.watch({"type": "http", "client": server.getpeername()}, send)
    nursery.start_soon(timed, {"type": "http.response.body"})
    await trio.testing.wait_all_tasks_blocked()
    return released


async def test_a_write_is_cut_after_the_timeout_without_progress_not_before() -> None:
    watch = SendWatch(TIMEOUT_S)
    with connection() as (port, _client, server):
        async with trio.open_nursery() as nursery:
            released = await waiting_write(watch, server, nursery)
            t = trio.current_time()
            assert watch.check(port, t + 0.5, EVERY_S) == 0  # not waiting a pass yet
            assert watch.check(port, t + 1.0, EVERY_S) == 0  # first seen waiting
            assert watch.check(port, t + 1.0 + 0.9 * TIMEOUT_S, EVERY_S) == 0
            assert not cut(server)
            assert watch.check(port, t + 1.0 + TIMEOUT_S, EVERY_S) == 1
            assert cut(server)
            assert watch.cut == 0  # (counted by run(), which logs it)
            released.set()


async def test_a_client_is_cut_a_timeout_after_it_last_took_something() -> None:
    watch = SendWatch(TIMEOUT_S)
    with connection() as (port, client, server):
        async with trio.open_nursery() as nursery:
            released = await waiting_write(watch, server, nursery)
            t = trio.current_time() + 1.0
            assert watch.check(port, t, EVERY_S) == 0
            for _ in range(4):  # the write has waited 4 timeouts; the client moved each time
                t += 0.9 * TIMEOUT_S
                take(client, server)
                assert watch.check(port, t, EVERY_S) == 0
            assert not cut(server)
            assert watch.check(port, t + 0.9 * TIMEOUT_S, EVERY_S) == 0  # since it last moved
            assert watch.check(port, t + TIMEOUT_S, EVERY_S) == 1
            assert cut(server)
            released.set()


async def test_a_write_that_ended_is_no_longer_watched() -> None:
    watch = SendWatch(TIMEOUT_S)
    with connection() as (port, _client, server):
        async with trio.open_nursery() as nursery:
            released = await waiting_write(watch, server, nursery)
            t = trio.current_time() + 1.0
            assert watch.check(port, t, EVERY_S) == 0
            released.set()
        assert watch.check(port, t + 2 * TIMEOUT_S, EVERY_S) == 0
        async with trio.open_nursery() as nursery:  # a later write waits on the same client
            released = await waiting_write(watch, server, nursery)
            assert watch.check(port, t + 3 * TIMEOUT_S, EVERY_S) == 0  # seen afresh
            assert not cut(server)
            released.set()


async def test_a_connection_gone_while_its_write_waits_is_not_taken_for_another() -> None:
    """Its fd number, kept between passes, may be another connection's by the next."""
    watch = SendWatch(TIMEOUT_S)
    with connection() as (port, _client, server), connection() as (_, _other_client, other):
        async with trio.open_nursery() as nursery:
            released = await waiting_write(watch, server, nursery)
            t = trio.current_time() + 1.0
            assert watch.check(port, t, EVERY_S) == 0
            os.dup2(other.fileno(), server.fileno())  # its fd: now a stuck connection unwatched
            assert watch.check(port, t + TIMEOUT_S, EVERY_S) == 0
            assert watch.check(port, t + 2 * TIMEOUT_S, EVERY_S) == 0  # found afresh: none
            assert not cut(other)
            released.set()

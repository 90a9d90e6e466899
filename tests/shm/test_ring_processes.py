"""Rings between real processes over real shared memory."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from rt.errors import Broken, Closed, EndOfChannel, WouldBlock
from rt.shm import Ring, RingReceiver, RingSender, new_run_prefix, sweep, waiter
from rt.shm.segment import list_segments, pid_alive

PEER = str(Path(__file__).with_name("peer.py"))
sys.path.insert(0, str(Path(__file__).parent))
from peer import frames  # noqa: E402


@asynccontextmanager
async def peer(ring: Ring, *args: str) -> AsyncIterator[trio.Process]:
    """Run peer.py as a child holding the ring's doorbells; kill it on the way out."""
    spec = json.dumps(dataclasses.asdict(ring.spec))
    proc = await trio.lowlevel.open_process(
        [sys.executable, PEER, args[0], spec, *args[1:]],
        pass_fds=ring.fds,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        if proc.stdout is not None:
            await proc.stdout.aclose()


async def wait_for_line(proc: trio.Process) -> str:
    assert proc.stdout is not None
    data = b""
    with trio.fail_after(30):
        while not data.endswith(b"\n"):
            chunk = await proc.stdout.receive_some()
            assert chunk, "peer exited before it attached"
            data += chunk
    return data.decode().strip()


@pytest.fixture
def ring() -> Iterator[Ring]:
    with Ring.create(new_run_prefix(), "test", capacity=4096) as ring:
        yield ring


@pytest.mark.slow
async def test_a_quarter_million_frames_of_random_sizes_arrive_intact(ring: Ring) -> None:
    """Every frame in order and intact; RT_RING_FRAMES=1000000 for a longer soak (the
    suite's default was a million: a minute of its time under load)."""
    n = int(os.environ.get("RT_RING_FRAMES", 250_000))
    with RingReceiver.attach(ring.spec) as rx:
        await receive_and_check(ring, rx, n)
    assert list_segments(ring.spec.name + "_x") == [], "a side segment outlived its frame"


async def receive_and_check(ring: Ring, rx: RingReceiver, n: int) -> None:
    async with peer(ring, "produce", str(n), "7") as proc:
        expected = frames(n, 7, ring.spec.capacity)
        for seq, tag, rest in expected:
            try:
                frame = rx.receive_nowait()
            except WouldBlock:
                frame = await rx.receive()
            data = frame.data
            assert data[: len(tag)] == tag, (
                f"frame {seq}: wrong sequence number (lost or reordered)"
            )
            assert data[len(tag) :] == rest, f"frame {seq}: corrupt payload"
            rx.commit(frame)
        with pytest.raises(EndOfChannel):
            await rx.receive()  # and nothing after the last one: no duplicate
        assert await proc.wait() == 0
    stats = rx.statistics()
    assert stats.frames_received == stats.frames_committed == n


async def test_a_killed_consumer_s_successor_receives_every_uncommitted_frame(
    ring: Ring, tmp_path: Path
) -> None:
    n = 20_000
    tx = RingSender.attach(ring.spec)
    logs = [tmp_path / "first.log", tmp_path / "second.log"]

    async def produce() -> None:
        for _, tag, rest in frames(n, 3, ring.spec.capacity, min_size=8):
            while True:
                try:
                    await tx.send([tag, rest])
                    break
                except Broken:  # the consumer is dead; its successor will attach
                    await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        async with peer(ring, "consume", str(n), str(logs[0])) as first:
            with trio.fail_after(30):
                while not logs[0].exists() or logs[0].stat().st_size < 8 * 2000:
                    await trio.sleep(0.005)
            first.send_signal(signal.SIGKILL)
            await first.wait()
        first_seen = read_log(logs[0])
        assert first_seen[-1] < n - 1, "the consumer finished before it could be killed"
        async with peer(ring, "consume", str(n - len(first_seen)), str(logs[1])) as second:
            with trio.fail_after(60):
                assert await second.wait() == 0
    second_seen = read_log(logs[1])
    assert first_seen == list(range(len(first_seen))), "first consumer: lost or reordered"
    assert second_seen[0] <= first_seen[-1] + 1, "frames were lost across the crash"
    assert second_seen == list(range(second_seen[0], n)), "second consumer: lost or reordered"
    tx.close()


def read_log(path: Path) -> list[int]:
    data = path.read_bytes()
    return [int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data), 8)]


async def test_a_dead_producer_breaks_a_waiting_receiver_within_a_second(ring: Ring) -> None:
    rx = RingReceiver.attach(ring.spec)
    async with peer(ring, "attach-sender") as proc:
        await wait_for_line(proc)
        async with trio.open_nursery() as nursery:

            async def kill_soon() -> None:
                await trio.sleep(0.2)
                proc.kill()

            nursery.start_soon(kill_soon)
            await trio.sleep(0.19)  # the receive below is parked when the kill lands
            start = time.monotonic()
            with trio.fail_after(5), pytest.raises(Broken, match="gone"):
                await rx.receive()
            assert time.monotonic() - start < 1.0
    rx.close()


async def test_a_dead_consumer_breaks_a_sender_waiting_on_a_full_ring(ring: Ring) -> None:
    tx = RingSender.attach(ring.spec)
    async with peer(ring, "attach-receiver") as proc:
        await wait_for_line(proc)
        while True:  # fill the ring: frames in it stay for a successor
            try:
                tx.send_nowait(b"x" * 500)
            except WouldBlock:
                break
        proc.kill()
        start = time.monotonic()
        with trio.fail_after(5), pytest.raises(Broken, match="gone"):
            await tx.send(b"one too many")
        assert time.monotonic() - start < 1.0
    successor = RingReceiver.attach(ring.spec)
    assert bytes(successor.receive_nowait().data) == b"x" * 500
    successor.close()
    tx.close()


async def test_a_parked_receiver_costs_next_to_no_cpu(ring: Ring) -> None:
    rx = RingReceiver.attach(ring.spec)
    async with peer(ring, "attach-sender") as proc:
        await wait_for_line(proc)
        cpu = time.process_time()
        with trio.move_on_after(2):
            await rx.receive()
        used = time.process_time() - cpu
    rx.close()
    assert used < 0.05 * 2, f"parked for 2 s but used {used:.3f} s of CPU"


async def test_closing_a_receiver_another_task_is_parked_on_says_closed(ring: Ring) -> None:
    rx = RingReceiver.attach(ring.spec)
    async with peer(ring, "attach-sender") as proc:
        await wait_for_line(proc)  # a live peer in another process: parked on its pidfd too
        async with trio.open_nursery() as nursery:

            async def close_soon() -> None:
                await trio.testing.wait_all_tasks_blocked()
                rx.close()

            nursery.start_soon(close_soon)
            with trio.fail_after(5), pytest.raises(Closed, match="closed while a task waited"):
                await rx.receive()


BUSY = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"


async def test_a_parked_receiver_costs_next_to_no_cpu_beside_busy_processes(ring: Ring) -> None:
    # Traffic first, so the receiver's waits are "hot" (its longest spin), then
    # nothing for a second while busy processes keep every core taken (the
    # contention of issue 10: two busy loops on this 2-core machine).
    if waiter.CORES > 8:
        pytest.skip("needs a busy process per core")
    busy = [
        subprocess.Popen([sys.executable, "-c", BUSY], stdin=subprocess.DEVNULL)
        for _ in range(waiter.CORES)
    ]
    try:
        with RingReceiver.attach(ring.spec) as rx:
            async with peer(ring, "trickle", "200"):
                for _ in range(200):
                    await rx.receive()
                    rx.commit()
                start = time.thread_time()
                with trio.move_on_after(1.0) as parked:
                    await rx.receive()
                used = time.thread_time() - start
    finally:
        for proc in busy:
            proc.kill()
        for proc in busy:
            proc.wait()
    assert parked.cancelled_caught
    assert used < 0.05, f"parked for 1 s beside busy processes but used {used * 1e3:.1f} ms of CPU"


async def test_the_sweep_removes_segments_of_a_killed_run() -> None:
    proc = await trio.lowlevel.open_process(
        [sys.executable, PEER, "own-ring"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
    )
    name = await wait_for_line(proc)
    assert name.startswith(f"rt_{proc.pid}_")
    assert list_segments(name) == [name]
    assert name not in sweep(), "the sweep removed a live run's segment"
    proc.kill()
    await proc.wait()
    assert proc.stdout is not None
    await proc.stdout.aclose()
    assert not pid_alive(proc.pid)
    assert name in sweep()
    assert list_segments(name) == []


async def test_a_receiver_sees_when_it_and_its_peer_may_run_on_one_cpu_only(
    ring: Ring, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A taskset, or a cpuset of one core: a spin would hold the CPU its peer
    # needs to answer, so the receiver parks at once (test_waiter.py). The
    # question is asked again as affinities change.
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("needs two CPUs, to tell one shared CPU from two")
    monkeypatch.setattr(waiter, "AFFINITY_S", 0.0)  # ask at every park
    cpu = min(cpus)
    try:
        with RingReceiver.attach(ring.spec) as rx:
            async with peer(ring, "trickle", "100") as proc:
                os.sched_setaffinity(proc.pid, {cpu})
                os.sched_setaffinity(0, {cpu})
                for _ in range(50):
                    await rx.receive()
                    rx.commit()
                assert rx._waiter.one_cpu, "pinned to one CPU with its peer, and still spins"
                os.sched_setaffinity(proc.pid, cpus - {cpu})
                for _ in range(50):
                    await rx.receive()
                    rx.commit()
                assert not rx._waiter.one_cpu, "its peer moved to another CPU: spinning may pay"
    finally:
        os.sched_setaffinity(0, cpus)

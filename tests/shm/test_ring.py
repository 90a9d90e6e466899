"""Ring semantics within one process: framing, backpressure, commit, close."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

import pytest
import trio
import trio.testing

from rt.errors import Broken, Closed, ConfigError, EndOfChannel, SegmentError, WouldBlock
from rt.shm import Ring, RingReceiver, RingSender, RingSpec, new_run_prefix
from rt.shm.segment import list_segments

CAP = 4096


@pytest.fixture
def ring() -> Iterator[Ring]:
    with Ring.create(new_run_prefix(), "unit", capacity=CAP) as ring:
        yield ring


@pytest.fixture
def pair(ring: Ring) -> Iterator[tuple[RingSender, RingReceiver]]:
    tx, rx = RingSender.attach(ring.spec), RingReceiver.attach(ring.spec)
    yield tx, rx
    tx.close()
    rx.close()


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 1000, CAP // 2 - 8, CAP // 2, CAP, 4 * CAP + 3])
async def test_frames_of_every_size_round_trip(pair, size: int) -> None:
    tx, rx = pair
    for i in range(5):  # several laps, so frames wrap around the end of the data area
        payload = os.urandom(size)
        await tx.send(payload)
        frame = await rx.receive()
        assert bytes(frame.data) == payload, f"lap {i}"
        rx.commit(frame)


async def test_scatter_gather_send_concatenates_chunks(pair) -> None:
    tx, rx = pair
    chunks = [b"head", bytearray(b"-middle-"), memoryview(b"tail")]
    tx.send_nowait(chunks)
    assert bytes(rx.receive_nowait().data) == b"head-middle-tail"


async def test_nowait_calls_say_would_block(pair) -> None:
    tx, rx = pair
    with pytest.raises(WouldBlock):
        rx.receive_nowait()
    sent = 0
    with pytest.raises(WouldBlock):
        while True:
            tx.send_nowait(b"x" * 100)
            sent += 1
    assert sent == CAP // 112  # each frame takes 8 + 104 bytes
    assert rx.statistics().bytes_in_use == sent * 112


async def test_a_full_ring_parks_the_sender_until_the_receiver_commits(pair) -> None:
    tx, rx = pair
    received = []

    async def produce() -> None:
        for i in range(200):
            await tx.send(i.to_bytes(4, "little") * 50)  # 200 B frames: ~20 fill the ring

    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        await trio.testing.wait_all_tasks_blocked()
        assert rx.statistics().bytes_in_use > CAP - 208, "the sender should have filled the ring"
        for _ in range(200):
            frame = await rx.receive()
            received.append(int.from_bytes(frame.data[:4], "little"))
            rx.commit(frame)
    assert received == list(range(200))
    assert tx.statistics().frames_sent == rx.statistics().frames_received == 200
    assert rx.statistics().frames_committed == 200
    assert tx.statistics().sleeps >= 1
    assert tx.statistics().peak_bytes_in_use <= CAP


async def test_uncommitted_frames_are_delivered_again_to_a_new_receiver(ring, pair) -> None:
    tx, rx = pair
    for i in range(4):
        tx.send_nowait(bytes([i]) * (3000 if i == 2 else 10))  # frame 2 goes through a side segment
    first = [rx.receive_nowait() for _ in range(4)]
    rx.commit(first[0])
    rx.close()  # dies having handled frame 0 only
    successor = RingReceiver.attach(ring.spec)
    again = [successor.receive_nowait() for _ in range(3)]
    assert [(f.offset, bytes(f.data)) for f in again] == [
        (f.offset, bytes(f.data)) for f in first[1:]
    ]
    successor.commit(again[0])
    successor.commit(again[0])  # committing twice is harmless
    successor.commit()
    with pytest.raises(WouldBlock):
        successor.receive_nowait()
    assert successor.statistics().frames_committed == 3
    successor.close()


async def test_commit_cannot_run_ahead_of_what_was_received(pair) -> None:
    tx, rx = pair
    tx.send_nowait(b"a")
    tx.send_nowait(b"b")
    first = rx.receive_nowait()
    rx.close()
    other = RingReceiver.attach(tx.spec)
    other.receive_nowait()
    other.receive_nowait()
    other.commit()
    stale = RingReceiver.attach(tx.spec)  # attaches after the commit: nothing to redeliver
    with pytest.raises(WouldBlock):
        stale.receive_nowait()
    with pytest.raises(ValueError, match="only"):
        stale.commit(first._replace(end=first.end + 1000))
    other.close()
    stale.close()


async def test_end_of_channel_comes_after_every_frame(pair) -> None:
    tx, rx = pair
    await tx.send(b"last words")
    await tx.aclose()
    assert bytes((await rx.receive()).data) == b"last words"
    with pytest.raises(EndOfChannel):
        await rx.receive()
    with pytest.raises(Closed):
        await tx.send(b"after close")


async def test_async_iteration_stops_at_end_of_channel(pair) -> None:
    tx, rx = pair
    for i in range(3):
        tx.send_nowait(bytes([i]))
    tx.close()
    assert [bytes(f.data) async for f in rx] == [b"\0", b"\1", b"\2"]


async def test_sending_to_a_closed_receiver_is_broken(pair) -> None:
    tx, rx = pair
    await rx.aclose()
    with pytest.raises(Broken, match="closed"):
        tx.send_nowait(b"x")
    with pytest.raises(Closed):
        rx.receive_nowait()
    with pytest.raises(Closed):
        rx.commit()


async def test_closing_the_sender_wakes_a_parked_receiver(pair) -> None:
    tx, rx = pair
    async with trio.open_nursery() as nursery:

        async def close_later() -> None:
            await trio.testing.wait_all_tasks_blocked()
            tx.close()

        nursery.start_soon(close_later)
        with trio.fail_after(5), pytest.raises(EndOfChannel):
            await rx.receive()
    assert rx.statistics().sleeps == 1


async def test_a_successor_attaching_between_the_wake_and_the_read_is_waited_for(
    ring: Ring,
) -> None:
    """A sender that closes wakes its parked receiver; a restarted sender attaching
    (which clears the closed flag) before the receiver reads leaves it nothing to
    read. That once raised WouldBlock out of ``receive`` and killed a scheduler
    when a tokenizer restarted; now it waits for the successor's frame."""

    class Racy(RingReceiver):
        successor: RingSender | None = None

        async def _wait_frame(self) -> bool:
            parked = await super()._wait_frame()
            if self.successor is None:  # the successor attaches in between
                self.successor = RingSender.attach(self.spec)
            return parked

    first = RingSender.attach(ring.spec)
    rx = Racy.attach(ring.spec)
    try:
        async with trio.open_nursery() as nursery:

            async def close_then_send() -> None:
                await trio.testing.wait_all_tasks_blocked()
                first.close()
                await trio.testing.wait_all_tasks_blocked()
                assert rx.successor is not None
                rx.successor.send_nowait(b"from the successor")

            nursery.start_soon(close_then_send)
            with trio.fail_after(5):
                frame = await rx.receive()
        assert bytes(frame.data) == b"from the successor"
    finally:
        rx.close()
        if rx.successor is not None:
            rx.successor.close()


async def test_a_cancelled_receive_leaves_the_ring_usable(pair) -> None:
    tx, rx = pair
    with trio.move_on_after(0.05) as scope:
        await rx.receive()
    assert scope.cancelled_caught
    tx.send_nowait(b"after")
    assert bytes((await rx.receive()).data) == b"after"


async def test_segments_are_private_and_gone_after_close() -> None:
    prefix = new_run_prefix()
    ring = Ring.create(prefix, "private", capacity=CAP)
    tx = RingSender.attach(ring.spec)
    tx.send_nowait(b"x" * (3 * CAP))  # an uncommitted side segment
    mode = os.stat(f"/dev/shm/{ring.spec.name}").st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert len(list_segments(prefix)) == 2
    tx.close()
    ring.close()
    assert list_segments(prefix) == []


async def test_attaching_to_a_missing_ring_says_so() -> None:
    spec = RingSpec(f"{new_run_prefix()}_missing", CAP, -1, -1)
    with pytest.raises(SegmentError, match="does not exist"):
        RingReceiver.attach(spec)


def test_capacity_must_be_a_power_of_two_that_frame_headers_can_address() -> None:
    for capacity in (5000, 32, 1 << 33):  # a frame's length is a u32
        with pytest.raises(ConfigError, match="power of two from 128 bytes to 4 GiB"):
            Ring.create(new_run_prefix(), "odd", capacity=capacity)


async def test_the_peak_is_a_level_the_ring_reached(pair) -> None:
    tx, _ = pair
    sent = 0
    with pytest.raises(WouldBlock):
        while True:
            tx.send_nowait(b"x" * 100)
            sent += 1
    assert tx.statistics().peak_bytes_in_use == sent * 112 < CAP  # not the frame that did not fit


async def test_marks_count_consumers_that_died_handling_a_frame(ring, pair) -> None:
    tx, rx = pair
    for i in range(3):
        tx.send_nowait(bytes([i]))
    first = rx.receive_nowait()
    assert rx.mark(first) == 1
    assert rx.mark(first) == 2  # marking again counts again: one mark per handling
    second = rx.receive_nowait()
    assert rx.mark(second) == 1
    rx.close()  # dies handling the second frame
    for attempt in (2, 3):  # each successor redoes the batch: the first frame, then the second
        successor = RingReceiver.attach(ring.spec)
        redo = successor.receive_nowait()
        assert successor.mark(redo) == 1, "a frame before the mark leaves the count alone"
        again = successor.receive_nowait()
        assert (again.offset, successor.mark(again)) == (second.offset, attempt)
        successor.close()
    last = RingReceiver.attach(ring.spec)
    frames = [last.receive_nowait() for _ in range(3)]
    assert last.mark(frames[0]) == 1
    assert last.mark(frames[1]) == 4
    assert last.mark(frames[2]) == 1  # a later frame starts a new count
    last.close()


async def test_payload_receive_delivers_every_frame_and_commits_them_all(ring, pair) -> None:
    tx, rx = pair
    sizes = [0, 5, 100, CAP // 2 - 8, 3000, 20, 1500, 1500]  # inline, wrapping, side segment
    for lap in range(3):
        payloads = [os.urandom(n) for n in sizes]
        got = []
        for payload in payloads:
            await tx.send(payload)
            got.append(bytes(await rx.receive_data()))
            rx.commit()
        assert got == payloads, f"lap {lap}"
    tx.send_nowait(b"handled")
    tx.send_nowait(b"not yet")
    assert rx.receive_data_nowait() == b"handled"
    rx.commit()
    assert rx.receive_data_nowait() == b"not yet"
    rx.close()  # dies before committing the second
    successor = RingReceiver.attach(ring.spec)
    assert successor.receive_data_nowait() == b"not yet"
    with pytest.raises(WouldBlock):
        successor.receive_data_nowait()
    successor.close()
    with pytest.raises(Closed):
        successor.receive_data_nowait()


async def test_payload_receive_waits_for_the_sender(pair) -> None:
    tx, rx = pair
    got: list[bytes | bytearray] = []

    async def receive() -> None:
        got.append(await rx.receive_data())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive)
        await trio.testing.wait_all_tasks_blocked()
        assert not got, "received from an empty ring"
        await tx.send(b"late")
    assert got == [b"late"]
    tx.close()
    with pytest.raises(EndOfChannel):
        await rx.receive_data()


async def test_a_closed_sender_refuses_even_the_fast_path(pair) -> None:
    tx, rx = pair
    tx.send_nowait(b"before")
    tx.close()
    with pytest.raises(Closed):
        tx.send_nowait(b"after")
    assert rx.receive_data_nowait() == b"before"

"""Frames bigger than half the ring, through side segments: names nobody can
take from the sender, and rings too small to point to one refused up front."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from rt.errors import ConfigError, SegmentError
from rt.shm import Ring, RingReceiver, RingSender, channel, layout, new_run_prefix
from rt.shm.ring import side_prefix
from rt.shm.segment import SHM_DIR, Segment, list_segments, unlink

NOBODY = 65534


def foreign_segment(name: str) -> None:
    """Create ``name`` in /dev/shm as another local user would: owned by nobody
    when we can (root), else by us, and holding something of its own."""
    segment = Segment.create(name, 64)
    segment.buf[:8] = b"not rt's"
    segment.close()
    if os.geteuid() == 0:
        os.chown(f"{SHM_DIR}/{name}", NOBODY, NOBODY)


def tokens(*values: str) -> Iterator[str]:
    yield from values
    while True:
        yield values[-1]


@pytest.fixture
def ring() -> Iterator[Ring]:
    with Ring.create(new_run_prefix(), "side", capacity=4096) as ring:
        yield ring


async def test_a_side_segment_name_taken_by_someone_else_is_never_reused(
    ring: Ring, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken, fresh = "a" * layout.SIDE_TOKEN_HEX, "b" * layout.SIDE_TOKEN_HEX
    squatted = f"{side_prefix(ring.spec.name)}0_{taken}"  # the first frame's offset is 0
    foreign_segment(squatted)
    picks = tokens(taken, fresh)
    monkeypatch.setattr(channel, "side_token", lambda: next(picks))
    try:
        with RingSender.attach(ring.spec) as tx, RingReceiver.attach(ring.spec) as rx:
            payload = os.urandom(3 * ring.spec.capacity)
            await tx.send(payload)
            assert bytes((await rx.receive()).data) == payload
            rx.commit()
        with contextlib.closing(Segment.open(squatted)) as left:
            assert left.buf[:8] == b"not rt's", "the other user's segment was touched"
    finally:
        unlink(squatted)
    assert list_segments(side_prefix(ring.spec.name)) == []


async def test_a_sender_that_finds_every_name_taken_says_so_and_goes_on(
    ring: Ring, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = "c" * layout.SIDE_TOKEN_HEX
    squatted = f"{side_prefix(ring.spec.name)}0_{taken}"
    foreign_segment(squatted)
    monkeypatch.setattr(channel, "side_token", lambda: taken)
    try:
        with RingSender.attach(ring.spec) as tx, RingReceiver.attach(ring.spec) as rx:
            with pytest.raises(SegmentError, match="were all taken"):
                await tx.send(b"x" * ring.spec.capacity)
            await tx.send(b"small frames need no side segment")
            assert bytes((await rx.receive()).data) == b"small frames need no side segment"
    finally:
        unlink(squatted)


async def test_a_corrupt_side_frame_never_names_a_segment_outside_the_ring(ring: Ring) -> None:
    with RingSender.attach(ring.spec) as tx, RingReceiver.attach(ring.spec) as rx:
        body = layout.side_body(10, "../../etc/passwd")
        head = tx._slots[layout.HEAD_SLOT]
        new_head = tx._ring.write_frame(head, layout.KIND_SIDE, [memoryview(body)], len(body))
        tx._publish(new_head)
        with pytest.raises(SegmentError, match="corrupt side frame"):
            rx.receive_nowait()


@pytest.mark.parametrize("capacity", [64, 32])
def test_a_ring_too_small_to_point_to_a_side_segment_is_refused(capacity: int) -> None:
    with pytest.raises(ConfigError, match="half the ring must hold the 56-byte frame"):
        Ring.create(new_run_prefix(), "tokenizer12-to-scheduler-xxxxxxxxxx", capacity=capacity)


async def test_the_smallest_ring_carries_a_big_frame_with_a_long_name() -> None:
    # r13: on a 64-byte ring, the frame that points to a side segment never fit.
    tag = "tokenizer12-to-scheduler-" + "x" * 40
    with (
        Ring.create(new_run_prefix(), tag, capacity=layout.MIN_RING_CAPACITY) as ring,
        RingSender.attach(ring.spec) as tx,
        RingReceiver.attach(ring.spec) as rx,
    ):
        for size in (100, 65, 10_000):
            tx.send_nowait(b"y" * size)  # an empty ring: never WouldBlock
            assert bytes(rx.receive_data_nowait()) == b"y" * size
            rx.commit()


def test_the_worst_side_frame_fits_half_the_smallest_ring() -> None:
    assert layout.side_frame_size(2**64 - 1) == layout.MAX_SIDE_FRAME
    assert layout.MAX_SIDE_FRAME <= layout.MIN_RING_CAPACITY // 2


def test_a_tag_too_long_for_side_segment_names_is_refused() -> None:
    with pytest.raises(ConfigError, match="shorten the ring's tag"):
        Ring.create(new_run_prefix(), "t" * 220, capacity=4096)


async def test_a_side_segment_shorter_than_its_frame_says_so(ring: Ring) -> None:
    with RingSender.attach(ring.spec) as tx, RingReceiver.attach(ring.spec) as rx:
        tx.send_nowait(b"z" * 3 * ring.spec.capacity)
        (side,) = list_segments(side_prefix(ring.spec.name))
        os.truncate(f"{SHM_DIR}/{side}", 100)
        with pytest.raises(SegmentError, match="holds 100 bytes"):
            rx.receive_nowait()

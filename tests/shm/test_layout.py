"""Property tests of the pure core: counters, wrap-around, framing."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from rt.shm import layout

CAPS = st.sampled_from([64, 128, 1024, 4096])


@given(cap=CAPS, offset=st.integers(0, 2**63), length=st.integers(0, 4096))
def test_spans_cover_the_bytes_exactly_once(cap: int, offset: int, length: int) -> None:
    length = min(length, cap)
    parts = layout.spans(offset, length, cap)
    assert sum(n for _, n in parts) == length
    assert len(parts) <= 2
    start, first = parts[0]
    assert start == offset % cap
    for s, n in parts:
        assert s >= 0 and s + n <= cap
    if len(parts) == 2:
        assert start + first == cap and parts[1][0] == 0


@given(n=st.integers(0, 10**6))
def test_frames_are_8_aligned_and_hold_their_payload(n: int) -> None:
    size = layout.frame_size(n)
    assert size % 8 == 0
    assert n + layout.FRAME_HEADER <= size < n + layout.FRAME_HEADER + 8


@settings(max_examples=200)
@given(
    cap=CAPS,
    start=st.sampled_from([0, 8, 2**40 - 64, 2**63 - 2**20]),
    ops=st.lists(st.one_of(st.integers(0, 600), st.just(-1)), max_size=200),
)
def test_a_ring_behaves_like_a_queue(cap: int, start: int, ops: list[int]) -> None:
    """Writes (n >= 0: a frame of n bytes) and reads (-1) against a deque model."""
    buf = bytearray(layout.segment_size(cap))
    ring = layout.RingLayout(buf, cap)
    ring.init(creator_pid=1, start=start)
    head = tail = start
    model: deque[bytes] = deque()
    for k, op in enumerate(ops):
        if op >= 0:
            payload = bytes((k + i) % 251 for i in range(op))
            if layout.frame_size(op) > layout.free(head, tail, cap):
                continue  # the sender would wait
            head = ring.write_frame(head, layout.KIND_INLINE, [memoryview(payload)], op)
            model.append(payload)
        elif model:
            length, kind = ring.read_header(tail)
            assert kind == layout.KIND_INLINE
            assert bytes(ring.read_payload(tail, length)) == model.popleft()
            tail += layout.frame_size(length)
        assert layout.used(head, tail) <= cap
        assert (head - tail == 0) == (not model)
    ring.release()


def test_a_fresh_header_is_valid_and_a_foreign_one_is_not() -> None:
    buf = bytearray(layout.segment_size(1024))
    ring = layout.RingLayout(buf, 1024)
    assert not ring.valid()
    ring.init(creator_pid=42)
    assert ring.valid()
    assert layout.RingLayout(buf, 1024).slots[layout.CREATOR_SLOT] == 42
    assert not layout.RingLayout(buf, 512).valid()

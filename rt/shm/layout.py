"""The pure core of a ring: header layout, counter arithmetic and framing.

Nothing here waits, maps or knows about processes: it works on any writable
buffer (an mmap in production, a bytearray in the property tests).

Header (each counter on its own 64-byte cache line)::

    0    magic, capacity, creator pid
    64   head: bytes the producer has published (monotonic u64)
    128  tail: bytes the consumer has committed (monotonic u64)
    192  consumer: sleeping flag, pid, closed flag, mark (frame offset, count)
    256  producer: sleeping flag, pid, closed flag
    4096 data area, ``capacity`` bytes (a power of two)

A frame is an 8-byte header (u32 payload length, u32 kind) followed by the
payload, padded to 8 bytes. Offsets are multiples of 8 and the capacity is a
power of two, so a header never straddles the end of the data area; a payload
may, and is then written and read in two pieces.

A frame bigger than half the ring travels in a side segment of its own; the
ring carries a *side frame* (kind 1) whose payload is the real length (u64)
and the side segment's name after the ring's side prefix
(``<offset>_<random hex>``). Half the ring must hold the biggest side frame,
hence :data:`MIN_RING_CAPACITY`.

Memory ordering (x86-64, TSO; see memory_order.py): the producer writes a frame's bytes, then
publishes it with one aligned 8-byte store to ``head``; stores are not
reordered with older stores, so a consumer that loads the new ``head`` sees
the bytes. The same holds for ``tail`` and the space it frees. Counters are
stored through ``memoryview.cast('Q')`` (one 8-byte store): ``struct.pack_into``
zeroes a field before writing it and a reader can see the torn value.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Sequence

from rt.errors import ConfigError

MAGIC = int.from_bytes(b"RTRING01", "little")
DATA_OFFSET = 4096
FRAME_HEADER = 8
MAX_CAPACITY = 1 << 32  # a frame's length is a u32; inline frames are at most half the ring
_FRAME = struct.Struct("<II")

# u64 slot indices in the header (byte offset // 8).
MAGIC_SLOT, CAPACITY_SLOT, CREATOR_SLOT = 0, 1, 2
HEAD_SLOT = 64 // 8
TAIL_SLOT = 128 // 8
CONSUMER_SLEEPING, CONSUMER_PID, CONSUMER_CLOSED = 192 // 8, 192 // 8 + 1, 192 // 8 + 2
MARK_OFFSET, MARK_COUNT = 192 // 8 + 3, 192 // 8 + 4  # the frame being handled, and by how many
PRODUCER_SLEEPING, PRODUCER_PID, PRODUCER_CLOSED = 256 // 8, 256 // 8 + 1, 256 // 8 + 2

KIND_INLINE = 0
KIND_SIDE = 1  # the payload names a side segment that holds the real payload

SIDE_BODY = struct.Struct("<Q")  # a side frame: the real payload's length, then the name suffix
SIDE_TOKEN_HEX = 16  # random hex digits in a side segment's name: not guessable in advance
SIDE_SUFFIX_MAX = 20 + 1 + SIDE_TOKEN_HEX  # "<offset: a u64, up to 20 digits>_<token>"
_SIDE_SUFFIX = re.compile(rf"[0-9]{{1,20}}_[0-9a-f]{{{SIDE_TOKEN_HEX}}}")
MIN_RING_CAPACITY = 128
NAME_MAX = 255  # a POSIX shared-memory name, as /dev/shm stores it


def align8(n: int) -> int:
    return (n + 7) & ~7


def frame_size(payload_len: int) -> int:
    """Bytes a frame with ``payload_len`` bytes of payload takes in the ring."""
    return FRAME_HEADER + align8(payload_len)


def used(head: int, tail: int) -> int:
    """Bytes in the ring: published but not yet committed."""
    assert head >= tail, f"head {head} behind tail {tail}"
    return head - tail


def free(head: int, tail: int, capacity: int) -> int:
    return capacity - used(head, tail)


def spans(offset: int, length: int, capacity: int) -> tuple[tuple[int, int], ...]:
    """Where ``length`` bytes starting at counter ``offset`` lie in the data area:
    one (start, length) span, or two when they wrap."""
    start = offset & (capacity - 1)
    first = min(length, capacity - start)
    if first == length:
        return ((start, length),)
    return ((start, first), (0, length - first))


def segment_size(capacity: int) -> int:
    return DATA_OFFSET + capacity


def check_capacity(capacity: int) -> None:
    """What the layout itself can address (the pure core; see check_ring_capacity)."""
    if capacity < 64 or capacity & (capacity - 1) or capacity > MAX_CAPACITY:
        raise ValueError(
            f"ring capacity must be a power of two from 64 bytes to 4 GiB, got {capacity}"
        )


def side_frame_size(offset: int) -> int:
    """Bytes the side frame written at counter ``offset`` takes in the ring."""
    return frame_size(SIDE_BODY.size + len(str(offset)) + 1 + SIDE_TOKEN_HEX)


MAX_SIDE_FRAME = frame_size(SIDE_BODY.size + SIDE_SUFFIX_MAX)
assert MAX_SIDE_FRAME <= MIN_RING_CAPACITY // 2, "the smallest ring must carry every side frame"


def check_ring_capacity(capacity: int, name: str) -> None:
    """Refuse a ring that could not carry every frame: any frame bigger than half
    the ring goes to a side segment, so half the ring must hold the side frame
    that points to it, and the side segment's name must be a valid name."""
    if capacity < MIN_RING_CAPACITY or capacity & (capacity - 1) or capacity > MAX_CAPACITY:
        raise ConfigError(
            f"ring capacity must be a power of two from {MIN_RING_CAPACITY} bytes to 4 GiB, "
            f"got {capacity}: a frame bigger than half the ring travels in a side segment, "
            f"and half the ring must hold the {MAX_SIDE_FRAME}-byte frame that points to it. "
            f"Use a capacity of at least {MIN_RING_CAPACITY} (rt's default is 1 MiB)"
        )
    longest = len(name) + 2 + SIDE_SUFFIX_MAX  # the side prefix adds "_x"
    if longest > NAME_MAX:
        raise ConfigError(
            f"ring name {name!r} is {len(name)} characters: its side segments' names would "
            f"reach {longest}, over the {NAME_MAX} a shared-memory name may have; shorten "
            f"the ring's tag by {longest - NAME_MAX} characters or more"
        )


def side_body(length: int, suffix: str) -> bytes:
    """The payload of a side frame: the real payload's length and the side segment's suffix."""
    return SIDE_BODY.pack(length) + suffix.encode()


def parse_side_body(body: bytes | bytearray) -> tuple[int, str]:
    """(real length, name suffix) of a side frame; ValueError if it is not one."""
    (length,) = SIDE_BODY.unpack_from(body)
    suffix = bytes(body[SIDE_BODY.size :]).decode("ascii", "replace")
    if not _SIDE_SUFFIX.fullmatch(suffix):
        raise ValueError(f"not a side frame: the name suffix is {suffix[:40]!r}")
    return length, suffix


class RingLayout:
    """Typed access to a ring's header and data area inside ``buf``."""

    __slots__ = ("capacity", "data", "slots", "words")

    def __init__(self, buf: mmap.mmap | memoryview | bytearray, capacity: int) -> None:
        check_capacity(capacity)
        view = memoryview(buf)
        self.slots = view[:DATA_OFFSET].cast("Q")
        self.data = view[DATA_OFFSET : DATA_OFFSET + capacity]
        # The data area as u64 words: a frame header (u32 length, u32 kind,
        # little-endian) is one word, ``length | kind << 32``, read or written
        # with one item access (cheaper than struct on the hot path).
        self.words = self.data.cast("Q")
        self.capacity = capacity

    def init(self, creator_pid: int, start: int = 0) -> None:
        """Write a fresh header. ``start`` lets tests begin counters near overflow."""
        for i in range(len(self.slots)):
            self.slots[i] = 0
        self.slots[CAPACITY_SLOT] = self.capacity
        self.slots[CREATOR_SLOT] = creator_pid
        self.slots[HEAD_SLOT] = start
        self.slots[TAIL_SLOT] = start
        self.slots[MAGIC_SLOT] = MAGIC

    def valid(self) -> bool:
        return self.slots[MAGIC_SLOT] == MAGIC and self.slots[CAPACITY_SLOT] == self.capacity

    def release(self) -> None:
        """Drop the views so the underlying mmap can be closed."""
        self.slots.release()
        self.words.release()
        self.data.release()

    def write_frame(self, at: int, kind: int, chunks: Sequence[memoryview], length: int) -> int:
        """Write a frame at counter ``at`` (not yet published). Returns the counter after it."""
        cap = self.capacity
        start = at & (cap - 1)
        _FRAME.pack_into(self.data, start, length, kind)
        pos = at + FRAME_HEADER
        if len(chunks) == 1 and start + FRAME_HEADER + length <= cap:  # the common case
            self.data[start + FRAME_HEADER : start + FRAME_HEADER + length] = chunks[0]
            return at + FRAME_HEADER + ((length + 7) & ~7)
        for chunk in chunks:
            n = chunk.nbytes
            done = 0
            for start, span in spans(pos, n, cap):
                self.data[start : start + span] = chunk[done : done + span]
                done += span
            pos += n
        assert pos == at + FRAME_HEADER + length, "chunks do not add up to length"
        return at + frame_size(length)

    def read_header(self, at: int) -> tuple[int, int]:
        """(payload length, kind) of the frame at counter ``at``."""
        length, kind = _FRAME.unpack_from(self.data, at & (self.capacity - 1))
        return length, kind

    def read_payload(self, at: int, length: int) -> bytearray:
        """A copy of the payload of the frame at counter ``at``."""
        start = (at + FRAME_HEADER) & (self.capacity - 1)
        if start + length <= self.capacity:  # the common case: no wrap
            return bytearray(self.data[start : start + length])
        out = bytearray(length)
        done = 0
        for start, span in spans(at + FRAME_HEADER, length, self.capacity):
            out[done : done + span] = self.data[start : start + span]
            done += span
        return out

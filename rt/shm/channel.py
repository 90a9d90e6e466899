"""The two endpoints of a ring, shaped like trio's memory channels.

Waiting is the eventcount pattern: spin briefly, then set our ``sleeping``
flag, fence, re-check, and park on our doorbell with
``trio.lowlevel.wait_readable``. The peer rings the doorbell only when it
sees the flag, so a busy ring makes no system calls. A parked endpoint wakes
every ``LIVENESS_S`` to check that its peer's process is still alive, so a
dead peer turns into :class:`~rt.errors.Broken`, never into a hang.

``Broken`` is not sticky: when a restarted peer attaches to the same ring,
the endpoint works again. Frames already in the ring are never lost: a
sender may publish into a ring whose receiver is dead (its successor will
read them), and a receiver reads every published frame before it reports
that the producer is gone.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence
from typing import TypeAlias

import trio

from rt.errors import Broken, Closed, EndOfChannel, SegmentError, WouldBlock
from rt.shm import layout
from rt.shm.doorbell import Doorbell
from rt.shm.ring import (
    Endpoint,
    Frame,
    RingSpec,
    fence,
    fence_acquire,
    fence_release,
    side_prefix,
)
from rt.shm.segment import Segment, unlink

Payload: TypeAlias = "bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]"

# How long to spin before parking. A wake from sleep costs ~100 µs on this
# VM, so under continuous traffic (the last wait ended within HOT_GAP_S) an
# endpoint spins longer than a wake: otherwise one side parks, its late reply
# makes the other park too, and every round trip pays two wakes from then on.
# After a quiet spell it spins only briefly, so an idle ring costs ~0% CPU.
SPIN_S = 20e-6
SPIN_HOT_S = 250e-6
HOT_GAP_S = 1e-3
LIVENESS_S = 0.2  # a parked endpoint checks its peer this often
_SIDE = struct.Struct("<Q")
SMALL_FRAME = 4096  # received as bytes (one C call); bigger ones as a writable bytearray
_HEAD, _TAIL, _DATA = layout.HEAD_SLOT, layout.TAIL_SLOT, layout.DATA_OFFSET
_CONSUMER_SLEEPING, _CONSUMER_CLOSED = layout.CONSUMER_SLEEPING, layout.CONSUMER_CLOSED
_new_tuple = tuple.__new__  # builds a Frame in C: half the cost of Frame(...)


def as_chunks(data: Payload) -> list[memoryview]:
    if isinstance(data, bytes):
        return [memoryview(data)]
    if isinstance(data, bytearray | memoryview):
        return [memoryview(data).cast("B")]
    return [memoryview(c) if type(c) is bytes else memoryview(c).cast("B") for c in data]


class Waiter:
    """Parks one endpoint (or a fan-in) until its condition holds, with a spin
    that adapts to traffic (see SPIN_HOT_S). Counts the times it slept."""

    def __init__(self, fd: int, set_sleeping: Callable[[int], None]) -> None:
        self.fd = fd
        self.set_sleeping = set_sleeping
        self.hot = False
        self.sleeps = 0

    async def wait(self, ready: Callable[[], bool], check_peer: Callable[[], None]) -> None:
        start = time.perf_counter()
        try:
            spin = SPIN_HOT_S if self.hot else SPIN_S
            self.sleeps += await park(ready, self.set_sleeping, self.fd, check_peer, spin)
        finally:
            self.hot = time.perf_counter() - start < HOT_GAP_S


async def park(
    ready: Callable[[], bool],
    set_sleeping: Callable[[int], None],
    fd: int,
    check_peer: Callable[[], None],
    spin: float = SPIN_S,
) -> bool:
    """Return once ``ready()`` holds. Returns whether we actually slept.
    ``check_peer`` raises when waiting longer is pointless (peer dead)."""
    deadline = time.perf_counter() + spin
    while time.perf_counter() < deadline:
        if ready():
            return False
    check_peer()
    slept = False
    while True:
        set_sleeping(1)
        fence()  # order "sleeping = 1" before the re-check's loads
        if ready():
            set_sleeping(0)
            return slept
        slept = True
        try:
            with trio.move_on_after(LIVENESS_S):
                await trio.lowlevel.wait_readable(fd)
        finally:
            set_sleeping(0)
        Doorbell(fd).drain()
        if ready():
            return slept
        check_peer()


class RingSender(Endpoint):
    """The producing end. One task of one process sends at a time."""

    MY_PID, MY_CLOSED = layout.PRODUCER_PID, layout.PRODUCER_CLOSED
    PEER_PID, PEER_CLOSED = layout.CONSUMER_PID, layout.CONSUMER_CLOSED

    @classmethod
    def attach(cls, spec: RingSpec) -> RingSender:
        return cls(spec)

    def __init__(self, spec: RingSpec) -> None:
        super().__init__(spec)
        self._capacity = spec.capacity
        self._mask = spec.capacity - 1
        self._max_inline = spec.capacity // 2
        self._waiting_for = 0
        self._full_message = f"ring {spec.name!r} has no room for this frame"
        self._waiter = Waiter(spec.space_fd, self._set_sleeping)
        self._data = self._ring.data
        self._words = self._ring.words
        self._tail_seen = self._tail()

    def send_nowait(self, data: Payload) -> None:
        """Publish one frame, or raise WouldBlock if the ring has no room for it."""
        if type(data) is bytes:
            # The common case, kept flat: one bytes object, inline, not wrapping
            # (``_max_inline`` is -1 once closed). The room check trusts the tail
            # we last read (the consumer's cache line stays put) and re-reads it
            # only when that shows too little.
            n = len(data)
            need = (n + 15) & ~7  # the 8-byte header, the payload padded to 8
            if need <= self._max_inline:
                slots = self._slots
                head = slots[_HEAD]
                start = head & self._mask
                capacity = self._capacity
                if start + need <= capacity:
                    if head + need - self._tail_seen > capacity:
                        self._see_tail(head)
                    if head + need - self._tail_seen <= capacity and not slots[_CONSUMER_CLOSED]:
                        self._words[start >> 3] = n  # the frame header: length, KIND_INLINE
                        start += 8
                        self._data[start : start + n] = data
                        slots[_HEAD] = head + need  # one 8-byte store publishes the frame
                        self._sent += 1
                        fence_acquire()  # order the publish before the load of the flag
                        fence_release()
                        if slots[_CONSUMER_SLEEPING]:
                            self._ring_peer(_CONSUMER_SLEEPING, self.spec.data_fd)
                        return
        self._send(as_chunks(data), block_ok=False)

    async def send(self, data: Payload) -> None:
        """Publish one frame, waiting for room (backpressure, never an error)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        chunks = as_chunks(data)
        need = self._send(chunks, block_ok=True)
        if need:
            self._waiting_for = need
            await self._waiter.wait(
                lambda: self._room() >= need or self.peer_closed(), self._check_consumer
            )
            self._send(chunks, block_ok=False)
        await trio.lowlevel.cancel_shielded_checkpoint()

    def close(self) -> None:
        """Close this side: the receiver gets EndOfChannel once it has read every frame."""
        self._max_inline = -1  # send_nowait's fast path then leaves it to _send: Closed
        self._close_mapping(self.spec.data_fd)

    def _room(self) -> int:
        return layout.free(self._head(), self._tail(), self.spec.capacity)

    def _see_tail(self, head: int) -> None:
        """Re-read the consumer's tail; the peak in use (up to ``head``, what
        is published) is sampled here, where the ring looks fullest."""
        self._tail_seen = tail = self._slots[_TAIL]
        if head - tail > self._peak:
            self._peak = head - tail

    def _set_sleeping(self, value: int) -> None:
        # Not a flag but a threshold: wake me once this much room is free. A
        # quarter of the ring at least, so a fast producer facing a slower
        # consumer is woken once per quarter ring, not once per frame (a
        # wake costs the waker ~200 µs of system call on this VM).
        self._slots[layout.PRODUCER_SLEEPING] = (
            max(self._waiting_for, self.spec.capacity // 4) if value else 0
        )

    def _check_consumer(self) -> None:
        if not self.peer_alive():
            raise Broken(
                f"the receiving process (pid {self._slots[self.PEER_PID]}) of ring "
                f"{self.spec.name!r} is gone and the ring is full; frames already sent stay "
                "in the ring for its successor"
            )

    def _send(self, chunks: list[memoryview], block_ok: bool) -> int:
        """Send if there is room and return 0. Without room: the frame size needed
        if ``block_ok``, else raise WouldBlock. (The hot path: kept flat on purpose.)"""
        if self._closed:
            raise Closed("this ring sender was closed")
        slots = self._slots
        if slots[layout.CONSUMER_CLOSED]:
            raise Broken(f"the receiver of ring {self.spec.name!r} closed it")
        length = chunks[0].nbytes if len(chunks) == 1 else sum(c.nbytes for c in chunks)
        head = slots[layout.HEAD_SLOT]
        need = layout.FRAME_HEADER + ((length + 7) & ~7)
        inline = need <= self._max_inline
        if not inline:
            side_name = f"{side_prefix(self.spec.name)}{head}"
            need = layout.frame_size(_SIDE.size + len(side_name))
        if self._capacity - (head - slots[layout.TAIL_SLOT]) < need:
            if block_ok:
                return need
            raise WouldBlock(self._full_message)
        if inline:
            new_head = self._ring.write_frame(head, layout.KIND_INLINE, chunks, length)
        else:
            body = _write_side(side_name, chunks, length)
            new_head = self._ring.write_frame(head, layout.KIND_SIDE, [body], body.nbytes)
        self._publish(new_head)
        return 0

    def _publish(self, new_head: int) -> None:
        """Make the frames written up to ``new_head`` visible, and wake a parked consumer."""
        slots = self._slots
        slots[_HEAD] = new_head  # one 8-byte store: the frame's bytes are before it
        self._sent += 1
        self._see_tail(new_head)
        fence_acquire()  # order the publish before the load of the consumer's flag
        fence_release()
        if slots[_CONSUMER_SLEEPING]:
            self._ring_peer(_CONSUMER_SLEEPING, self.spec.data_fd)


class RingReceiver(Endpoint):
    """The consuming end. Frames stay in the ring until committed."""

    MY_PID, MY_CLOSED = layout.CONSUMER_PID, layout.CONSUMER_CLOSED
    PEER_PID, PEER_CLOSED = layout.PRODUCER_PID, layout.PRODUCER_CLOSED

    @classmethod
    def attach(cls, spec: RingSpec, source: int = 0) -> RingReceiver:
        return cls(spec, source)

    def __init__(self, spec: RingSpec, source: int = 0) -> None:
        super().__init__(spec)
        self.source = source
        # A (re)attached receiver starts at the last commit: everything its
        # predecessor received but did not commit is delivered again.
        self._read = self._tail()
        self._capacity = spec.capacity
        self._mask = spec.capacity - 1
        self._empty_message = f"ring {spec.name!r} is empty"
        self._waiter = Waiter(spec.data_fd, self.set_sleeping)
        self._head_seen = self._read  # the producer's head when we last read it
        self._words = self._ring.words
        self._map = self._segment.buf
        self._map_base = _DATA + 8  # a frame's payload in the mapping, after its header
        self._sides: dict[int, str] = {}  # a received frame's end -> its side segment

    def has_frame(self) -> bool:
        return self._head() != self._read

    def receive_nowait(self) -> Frame:
        """The next frame after those received, or WouldBlock / EndOfChannel."""
        at = self._read
        data = self.receive_data_nowait()
        return _new_tuple(Frame, (data, at, self._read, self.source))

    def receive_data_nowait(self) -> bytes | bytearray:
        """The next frame's payload alone, for a consumer that commits with
        ``commit()`` (everything received); cheaper than a :class:`Frame`."""
        at = self._read
        if at == self._head_seen:  # (close() sets _head_seen = _read: we come here)
            # Re-read the producer's head only when the frames we knew of are
            # used up (its cache line then stays put while we read them).
            if self._closed:
                raise Closed("this ring receiver was closed")
            slots = self._slots
            closed = slots[self.PEER_CLOSED]  # load the flag before head: see layout
            head = slots[_HEAD]
            if head == at:
                if closed:
                    raise EndOfChannel(f"the sender closed ring {self.spec.name!r}")
                raise WouldBlock(self._empty_message)
            self._head_seen = head
            if head - slots[_TAIL] > self._peak:
                self._peak = head - slots[_TAIL]
        start = at & self._mask
        length = self._words[start >> 3]  # the frame header: length | kind << 32
        data: bytes | bytearray
        if length <= SMALL_FRAME and start + 8 + length <= self._capacity:
            # The common case: inline (kind 0), small, not wrapping. One C call.
            start += self._map_base
            data = self._map[start : start + length]
        else:
            length, kind = length & 0xFFFFFFFF, length >> 32
            data = self._ring.read_payload(at, length)
            if kind == layout.KIND_SIDE:
                data, self._sides[at + layout.frame_size(length)] = _read_side(data)
        self._read = at + 8 + ((length + 7) & ~7)
        self._received += 1
        return data

    async def receive(self) -> Frame:
        """The next frame, waiting for one. Raises Broken if the sender died and
        every frame it published has been received, EndOfChannel if it closed."""
        await self._wait_frame()
        frame = self.receive_nowait()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return frame

    async def receive_data(self) -> bytes | bytearray:
        """The next frame's payload, waiting for one (see receive_data_nowait)."""
        await self._wait_frame()
        data = self.receive_data_nowait()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return data

    async def _wait_frame(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self.has_frame():
            self.release_producer()
            await self._waiter.wait(
                lambda: self.has_frame() or self.peer_closed(), self.check_producer
            )

    def commit(self, frame: Frame | None = None) -> None:
        """Release every frame up to and including ``frame`` (default: all received).
        Committing again what is already committed does nothing."""
        if self._closed:
            raise Closed("this ring receiver was closed")
        upto = self._read if frame is None else frame.end
        if upto > self._read:
            raise ValueError(f"cannot commit up to {upto}: only {self._read} was received")
        slots = self._slots
        if upto <= slots[layout.TAIL_SLOT]:
            return
        slots[layout.TAIL_SLOT] = upto
        # Frames received after ``upto`` stay uncommitted: count them by their
        # headers (none in the common case, a commit of everything received).
        self._committed = self._received - self._frames_between(upto, self._read)
        if self._sides:
            for end in [end for end in self._sides if end <= upto]:
                unlink(self._sides.pop(end))
        fence_acquire()  # order the commit before the load of the producer's threshold
        fence_release()
        wanted = slots[layout.PRODUCER_SLEEPING]
        if wanted and self.spec.capacity - (slots[layout.HEAD_SLOT] - upto) >= wanted:
            self._ring_peer(layout.PRODUCER_SLEEPING, self.spec.space_fd)

    def _frames_between(self, start: int, stop: int) -> int:
        count = 0
        while start < stop:
            length = self._words[(start & self._mask) >> 3] & 0xFFFFFFFF
            start += 8 + ((length + 7) & ~7)
            count += 1
        return count

    def release_producer(self) -> None:
        """Wake a parked producer whatever room it asked for: called before this
        receiver parks itself, so two parked ends never wait on each other."""
        if self._slots[layout.PRODUCER_SLEEPING]:
            self._ring_peer(layout.PRODUCER_SLEEPING, self.spec.space_fd)

    def mark(self, frame: Frame) -> int:
        """Record that ``frame`` is being handled now. Returns how many consumers
        in a row, this one included, started handling this very frame: 1 the
        first time; more when predecessors died with it in hand (a poison frame).

        Frames are handled in order, so a frame before the marked one is one a
        predecessor got past: marking it again (a successor redoing a batch)
        leaves the mark where the predecessor died."""
        slots = self._slots
        marked = slots[layout.MARK_OFFSET] - 1  # stored + 1: zero means "no mark"
        if frame.offset < marked:
            return 1
        count = slots[layout.MARK_COUNT] + 1 if frame.offset == marked else 1
        slots[layout.MARK_COUNT] = count
        slots[layout.MARK_OFFSET] = frame.offset + 1
        return count

    def set_sleeping(self, value: int) -> None:
        self._slots[layout.CONSUMER_SLEEPING] = value

    def check_producer(self) -> None:
        if not self.peer_alive():
            raise Broken(
                f"the sending process (pid {self._slots[self.PEER_PID]}) of ring "
                f"{self.spec.name!r} is gone and every frame it sent was received"
            )

    def producer_gone(self) -> bool:
        """Closed or dead: nothing more will come until a successor attaches."""
        return self.peer_closed() or not self.peer_alive()

    def close(self) -> None:
        """Close this side. Uncommitted frames stay in the ring for a successor."""
        self._head_seen = self._read  # receive_nowait then checks _closed
        self._close_mapping(self.spec.space_fd)

    def __aiter__(self) -> RingReceiver:
        return self

    async def __anext__(self) -> Frame:
        try:
            return await self.receive()
        except EndOfChannel:
            raise StopAsyncIteration from None


def _write_side(name: str, chunks: list[memoryview], length: int) -> memoryview:
    """Put a frame too big for the ring in a side segment of its own (named
    after the frame's offset); return the body of the ring frame that points to it.
    The receiver unlinks the side segment when it commits the frame."""
    try:
        side = Segment.create(name, max(length, 1))
    except SegmentError:  # left by a predecessor that died before publishing
        unlink(name)
        side = Segment.create(name, max(length, 1))
    with memoryview(side.buf) as view:
        pos = 0
        for chunk in chunks:
            view[pos : pos + chunk.nbytes] = chunk
            pos += chunk.nbytes
    side.close()
    return memoryview(_SIDE.pack(length) + name.encode())


def _read_side(body: bytearray) -> tuple[bytearray, str]:
    (length,) = _SIDE.unpack_from(body)
    name = body[_SIDE.size :].decode()
    side = Segment.open(name)
    data = bytearray(length)
    with memoryview(side.buf) as view:
        data[:] = view[:length]
    side.close()
    return data, name

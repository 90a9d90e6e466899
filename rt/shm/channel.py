"""The two endpoints of a ring, shaped like trio's memory channels.

Waiting (rt/shm/waiter.py) spins while spinning pays off, then parks on a
doorbell the peer rings only when it sees our ``sleeping`` slot set; a
parked endpoint checks every ``waiter.LIVENESS_S`` that its peer's process is
still alive, so a dead peer turns into :class:`~rt.errors.Broken`, never
into a hang.

``Broken`` is not sticky: when a restarted peer attaches to the same ring,
the endpoint works again. Frames already in the ring are never lost: a
sender may publish into a ring whose receiver is dead (its successor will
read them), and a receiver reads every published frame before it reports
that the producer is gone.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from functools import partial
from typing import TypeAlias

import trio

from rt.errors import (
    Broken,
    Closed,
    EndOfChannel,
    ResourceExhausted,
    SegmentError,
    WouldBlock,
)
from rt.shm import layout
from rt.shm.memory_order import fence_acquire, fence_release
from rt.shm.ring import Endpoint, Frame, RingSpec, side_prefix
from rt.shm.segment import SHM_DIR, Segment, unlink
from rt.shm.waiter import Waiter

Payload: TypeAlias = "bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]"

SMALL_FRAME = 4096  # received as bytes (one C call); bigger ones as a writable bytearray
SIDE_NAME_TRIES = 8  # fresh names tried for a side segment before giving up
SHM_FULL_RETRY_S = 0.005, 0.5  # a send waiting for room in /dev/shm looks again: first, most
SHM_FULL_WAIT_S = 10.0  # then gives up: the room may be held by a frame that waits on this one
log = logging.getLogger(__name__)
_HEAD, _TAIL, _DATA = layout.HEAD_SLOT, layout.TAIL_SLOT, layout.DATA_OFFSET
_CONSUMER_SLEEPING, _CONSUMER_CLOSED = layout.CONSUMER_SLEEPING, layout.CONSUMER_CLOSED
_new_tuple = tuple.__new__  # builds a Frame in C: half the cost of Frame(...)


def as_chunks(data: Payload) -> list[memoryview]:
    if isinstance(data, bytes):
        return [memoryview(data)]
    if isinstance(data, bytearray | memoryview):
        return [memoryview(data).cast("B")]
    return [memoryview(c) if type(c) is bytes else memoryview(c).cast("B") for c in data]


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
        self._waiter = Waiter(spec.space_fd, self._set_sleeping, self.peer_fds)
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
        """Publish one frame, waiting for room (backpressure, never an error):
        room in the ring, and for a frame too big for it, room in /dev/shm for a
        side segment, which the receivers free as they commit theirs. Raises
        ResourceExhausted for a frame that can never fit (``fits_ever`` False), or
        after ``SHM_FULL_WAIT_S`` without room: a receiver may hold the room until
        this very frame is sent (it commits its input after handling it)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        chunks = as_chunks(data)
        pause, since = 0.0, 0.0
        while True:
            try:
                need = self._send(chunks, block_ok=True)
                parked = False
                if need:
                    self._waiting_for = need
                    parked = await self._waiter.wait(
                        partial(self._room_for, need), self._check_consumer
                    )
                    self._send(chunks, block_ok=False)
                break
            except ResourceExhausted as err:
                since = since or time.monotonic()
                pause = await self._wait_for_shm(err, pause, since)
        if not parked:  # parking went through trio's scheduler already
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def _wait_for_shm(self, err: ResourceExhausted, pause: float, since: float) -> float:
        """Sleep before trying again a side segment /dev/shm had no room for (or
        this process no fd); returns the next pause (doubling)."""
        if not err.fits_ever or time.monotonic() - since > SHM_FULL_WAIT_S:
            raise err
        first, most = SHM_FULL_RETRY_S
        if not pause:
            log.warning("ring %r: %s; the frame waits for room", self.spec.name, err)
        pause = min(2 * pause, most) if pause else first
        await trio.sleep(pause)
        return pause

    def close(self) -> None:
        """Close this side: the receiver gets EndOfChannel once it has read every frame."""
        self._max_inline = -1  # send_nowait's fast path then leaves it to _send: Closed
        self._close_mapping(self.spec.data_fd)

    def _room_for(self, need: int) -> bool:
        return self._room() >= need or self.peer_closed()

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
            need = layout.side_frame_size(head)
        if self._capacity - (head - slots[layout.TAIL_SLOT]) < need:
            if block_ok:
                return need
            raise WouldBlock(self._full_message)
        if inline:
            new_head = self._ring.write_frame(head, layout.KIND_INLINE, chunks, length)
        else:
            body = _write_side(self.spec.name, head, chunks, length)
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
        self._waiter = Waiter(spec.data_fd, self.set_sleeping, self.peer_fds)
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
                try:
                    data, self._sides[at + layout.frame_size(length)] = _read_side(
                        self.spec.name, data
                    )
                except ResourceExhausted:
                    raise  # the frame stays next: read it again once fds are back
                except SegmentError:  # its segment is gone or corrupt: the frame is lost,
                    self._read = at + 8 + ((length + 7) & ~7)  # and the ring goes on
                    self._received += 1
                    raise
        self._read = at + 8 + ((length + 7) & ~7)
        self._received += 1
        return data

    async def receive(self) -> Frame:
        """The next frame, waiting for one. Raises Broken if the sender died and
        every frame it published has been received, EndOfChannel if it closed."""
        while True:
            parked = await self._wait_frame()
            try:
                frame = self.receive_nowait()
            except WouldBlock:  # see _wait_frame
                continue
            if not parked:  # parking went through trio's scheduler already
                await trio.lowlevel.cancel_shielded_checkpoint()
            return frame

    async def receive_data(self) -> bytes | bytearray:
        """The next frame's payload, waiting for one (see receive_data_nowait)."""
        while True:
            parked = await self._wait_frame()
            try:
                data = self.receive_data_nowait()
            except WouldBlock:  # see _wait_frame
                continue
            if not parked:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data

    async def _wait_frame(self) -> bool:
        """Wait for a frame, or for the sender to close; returns whether it parked
        (see Waiter.wait). A closed sender's successor may attach, and clear the
        closed flag, before the caller reads: then there is nothing to read after
        all (WouldBlock), and the caller waits again (it used to raise it, and
        a scheduler died of a tokenizer's restart)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.has_frame():
            return False
        self.release_producer()
        return await self._waiter.wait(
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


def side_token() -> str:
    """The random part of a side segment's name (not guessable by another local user)."""
    return secrets.token_hex(layout.SIDE_TOKEN_HEX // 2)


def _write_side(ring_name: str, head: int, chunks: list[memoryview], length: int) -> memoryview:
    """Put a frame too big for the ring in a side segment of its own; return the
    body of the side frame that points to it. The receiver unlinks the side
    segment when it commits the frame; ``Ring.close`` unlinks any left (by a
    sender that died before publishing one).

    The name is the ring's side prefix, the frame's offset and a random token:
    a name already taken (by anyone: another local user can create names in
    /dev/shm) is never reused or unlinked, a fresh one is drawn instead."""
    prefix = side_prefix(ring_name)
    for _ in range(SIDE_NAME_TRIES):
        suffix = f"{head}_{side_token()}"
        side = Segment.create_new(prefix + suffix, max(length, 1))
        if side is not None:
            break
    else:
        raise SegmentError(
            f"cannot create a side segment for a {length}-byte frame of ring {ring_name!r}: "
            f"{SIDE_NAME_TRIES} fresh random names under {prefix!r} were all taken in "
            f"{SHM_DIR}. Another process is creating segments under this run's names: "
            f"find it (ls -l {SHM_DIR}); frames up to half the ring's capacity do not "
            "need a side segment"
        )
    with memoryview(side.buf) as view:
        pos = 0
        for chunk in chunks:
            view[pos : pos + chunk.nbytes] = chunk
            pos += chunk.nbytes
    side.close()
    return memoryview(layout.side_body(length, suffix))


def _read_side(ring_name: str, body: bytearray) -> tuple[bytearray, str]:
    """The payload a side frame points to, and the side segment's name. Only a
    segment under this ring's side prefix is ever opened (and later unlinked)."""
    try:
        length, suffix = layout.parse_side_body(body)
    except ValueError as err:
        raise SegmentError(f"ring {ring_name!r} holds a corrupt side frame: {err}") from err
    name = side_prefix(ring_name) + suffix
    side = Segment.open(name)
    if (size := side.size) < length:
        side.close()
        raise SegmentError(f"side segment {name!r} holds {size} bytes, not the {length} expected")
    data = bytearray(length)
    with memoryview(side.buf) as view:
        data[:] = view[:length]
    side.close()
    return data, name

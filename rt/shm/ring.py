"""A ring's owner, its picklable spec, and what both endpoints share.

The supervisor *owns* a ring: it creates the segment and both doorbells,
hands ``ring.spec`` and ``ring.fds`` to the children, and unlinks everything
at shutdown. Endpoints *attach* to a spec from any process that holds the
fds; a restarted endpoint attaches to the same spec and carries on.
"""

from __future__ import annotations

import os
import select
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Self

import trio

from rt.errors import SegmentError
from rt.shm import layout
from rt.shm.doorbell import Doorbell
from rt.shm.memory_order import check_memory_order, fence
from rt.shm.segment import Segment, list_segments, pid_alive, unlink

if TYPE_CHECKING:
    from rt.shm.waiter import Waiter


@dataclass(frozen=True)
class RingSpec:
    """What an endpoint needs to attach: picklable, small, fds inherited."""

    name: str  # the segment's name
    capacity: int
    data_fd: int  # the consumer sleeps on it; the producer rings it
    space_fd: int  # the producer sleeps on it; the consumer rings it

    @property
    def fds(self) -> tuple[int, int]:
        return (self.data_fd, self.space_fd)


class Ring:
    """The owner of one ring: segment plus doorbells. Create it in the supervisor.

    ``data_bell`` may be shared by several rings that one consumer reads
    (see :class:`rt.shm.fanin.FanInReceiver`); the owner then does not close it.
    """

    def __init__(self, spec: RingSpec, segment: Segment, owns_data_bell: bool) -> None:
        self.spec = spec
        self._segment = segment
        self._owns_data_bell = owns_data_bell
        self._closed = False

    @classmethod
    def create(
        cls, prefix: str, tag: str, capacity: int = 1 << 20, data_bell: Doorbell | None = None
    ) -> Ring:
        """A new ring named ``<prefix>_<tag>`` (``prefix`` from :func:`new_run_prefix`).
        Raises ConfigError off x86-64 (see memory_order.py) and for a capacity
        that could not carry every frame (see layout.check_ring_capacity)."""
        check_memory_order()
        name = f"{prefix}_{tag}"
        layout.check_ring_capacity(capacity, name)
        segment = Segment.create(name, layout.segment_size(capacity))
        ring_layout = layout.RingLayout(segment.buf, capacity)
        ring_layout.init(os.getpid())
        ring_layout.release()
        owns = data_bell is None
        data_bell = data_bell or Doorbell.create()
        space_bell = Doorbell.create()
        spec = RingSpec(segment.name, capacity, data_bell.fd, space_bell.fd)
        return cls(spec, segment, owns)

    @property
    def fds(self) -> tuple[int, int]:
        """The fds a child process needs (put them in ``pass_fds``)."""
        return self.spec.fds

    def close(self) -> None:
        """Unlink the segment and every side segment of it, close the doorbells."""
        if self._closed:
            return
        self._closed = True
        self._segment.close()
        self._segment.unlink()
        for name in list_segments(side_prefix(self.spec.name)):
            unlink(name)
        if self._owns_data_bell:
            Doorbell(self.spec.data_fd).close()
        Doorbell(self.spec.space_fd).close()

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def side_prefix(ring_name: str) -> str:
    """Every side segment of ring ``ring_name`` is named this plus a side frame's suffix."""
    return f"{ring_name}_x"


class Frame(NamedTuple):
    """One received frame. ``offset`` is its position in the ring's byte stream:
    a frame redelivered to a successor has the same offset, so handlers can
    recognise duplicates. ``source`` is the ring's index in a fan-in."""

    data: bytes | bytearray  # bytes for a small inline frame (a copy out of the ring)
    offset: int
    end: int
    source: int = 0


@dataclass(frozen=True)
class RingStatistics:
    """A snapshot of one endpoint. ``sleeps``: times this endpoint parked on
    its doorbell; ``wakeups``: times it rang the peer's doorbell.
    ``peak_bytes_in_use`` is sampled when the endpoint reads its peer's
    counter (a receiver when it runs out of known frames, a sender when it
    runs out of known room) and at the snapshot: a high-water mark, not a
    trace of every frame."""

    capacity: int
    bytes_in_use: int
    peak_bytes_in_use: int
    frames_sent: int
    frames_received: int
    frames_committed: int
    sleeps: int
    wakeups: int


class PeerWatch:
    """Is the process at a given pid still running? Uses a pidfd, which turns
    readable when the process exits (zombies included), so no signal races;
    a parked endpoint waits on it too (see waiter.py)."""

    def __init__(self) -> None:
        self._pid = 0
        self._fd: int | None = None

    def alive(self, pid: int) -> bool:
        if pid == 0 or pid == os.getpid():
            return True  # no peer attached yet, or both ends in this process
        if pid != self._pid:
            self.close()
            try:
                self._fd = os.pidfd_open(pid)
            except ProcessLookupError:
                self._pid = pid
                return False
            except OSError:  # out of fds (EMFILE): ask the pid, and try again next time
                return pid_alive(pid)
            self._pid = pid
        if self._fd is None:
            return False
        poller = select.poll()  # (not select.select: an fd past 1024 is out of its range,
        poller.register(self._fd, select.POLLIN)  # and rt-serve raises its fd limit)
        return not poller.poll(0)

    def watch_fd(self, pid: int) -> int | None:
        """A pidfd that turns readable when the peer at ``pid`` exits (at once if
        it has); None when there is none to wait on (no peer yet, this process,
        or gone before its pidfd could be opened)."""
        if pid == 0 or pid == os.getpid():
            return None
        if pid != self._pid:
            self.alive(pid)  # opens the pidfd (if it can: else None, and waits poll)
        return self._fd if pid == self._pid else None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None
        self._pid = 0


class Endpoint:
    """What a sender and a receiver share: the mapped layout, their own slots
    in the header, liveness of the peer, and counters for statistics."""

    # Slot indices of this side and the peer's; set by subclasses.
    _waiter: Waiter
    MY_PID: int
    MY_CLOSED: int
    PEER_PID: int
    PEER_CLOSED: int

    def __init__(self, spec: RingSpec) -> None:
        check_memory_order()
        self.spec = spec
        self._segment = Segment.open(spec.name)
        self._ring = layout.RingLayout(self._segment.buf, spec.capacity)
        if not self._ring.valid():
            self._ring.release()
            self._segment.close()
            raise SegmentError(f"segment {spec.name!r} does not hold an rt ring of this capacity")
        self._slots = self._ring.slots
        self._slots[self.MY_CLOSED] = 0
        self._slots[self.MY_PID] = os.getpid()
        self._peer = PeerWatch()
        self._closed = False
        self._peak = 0
        self._sent = self._received = self._committed = 0
        self._wakeups = 0

    def peer_alive(self) -> bool:
        return self._peer.alive(self._slots[self.PEER_PID])

    def peer_closed(self) -> bool:
        return bool(self._slots[self.PEER_CLOSED])

    def peer_fds(self) -> tuple[tuple[int, int], ...] | None:
        """The peer's (pid, pidfd) to park on (see Waiter), or None."""
        pid = self._slots[self.PEER_PID]
        fd = self._peer.watch_fd(pid)
        return None if fd is None else ((pid, fd),)

    def statistics(self) -> RingStatistics:
        in_use = 0 if self._closed else layout.used(self._head(), self._tail())
        return RingStatistics(
            capacity=self.spec.capacity,
            bytes_in_use=in_use,
            peak_bytes_in_use=max(self._peak, in_use),
            frames_sent=self._sent,
            frames_received=self._received,
            frames_committed=self._committed,
            sleeps=self._waiter.sleeps,
            wakeups=self._wakeups,
        )

    def _head(self) -> int:
        return self._slots[layout.HEAD_SLOT]

    def _tail(self) -> int:
        return self._slots[layout.TAIL_SLOT]

    def _ring_peer(self, sleeping_slot: int, fd: int) -> None:
        """Wake a parked peer. Clearing its flag first means the rings that follow,
        while it is still waking, make no system call. Safe because every clear
        is followed by a ring: a peer that re-armed its flag in between is woken,
        re-checks, and re-arms again."""
        self._slots[sleeping_slot] = 0
        self._wakeups += 1
        Doorbell(fd).ring()

    def _close_mapping(self, peer_fd: int) -> None:
        """Mark this side closed, wake the peer so it notices, unmap."""
        if self._closed:
            return
        self._closed = True
        self._slots[self.MY_CLOSED] = 1
        fence()
        Doorbell(peer_fd).ring()
        self._waiter.close()
        self._peer.close()
        self._ring.release()
        self._segment.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

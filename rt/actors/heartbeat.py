"""Heartbeats in shared memory: two u64 slots per child, the last beat's time
and whether the child has requests in hand (see ``Heartbeat.set_handling``).

A child stores ``time.monotonic_ns()`` (CLOCK_MONOTONIC, the same clock in
every process) into its slot; the parent reads it to tell how long the child
has made no progress. The store is one aligned 8-byte write through a
``'Q'``-cast memoryview, never ``struct.pack_into``, which zeroes the field
first and lets a reader see a torn 0 (see DESIGN.md, Rings).

The second slot is 1 while the child handles client requests (tokenizing a
batch, a scheduler step): a death then is charged to those requests (poison
marks, quarantine), not to the child's restart intensity, so a stream of
poison requests cannot stop the engine (``Supervisor`` reads it at each exit).
"""

from __future__ import annotations

import time

from rt.shm.segment import Segment


class HeartbeatTable:
    """The parent's side: owns the segment, reads every slot."""

    def __init__(self, segment: Segment, slots: int) -> None:
        self._segment = segment
        self._view = memoryview(segment.buf).cast("Q")
        self.slots = slots

    @classmethod
    def create(cls, prefix: str, slots: int, tag: str = "hb") -> HeartbeatTable:
        return cls(Segment.create(f"{prefix}_{tag}", 16 * max(slots, 1)), slots)

    @property
    def name(self) -> str:
        return self._segment.name

    def last_beat_ns(self, slot: int) -> int:
        return int(self._view[2 * slot])

    def age(self, slot: int, since_ns: int = 0) -> float:
        """Seconds since the later of the slot's last beat and ``since_ns``."""
        last = max(int(self._view[2 * slot]), since_ns)
        return max(0.0, (time.monotonic_ns() - last) / 1e9)

    def handling(self, slot: int) -> bool:
        """Whether the child said it had client requests in hand (read it at its exit)."""
        return bool(self._view[2 * slot + 1])

    def reset(self, slot: int) -> None:
        """Before a (re)start: no beat yet, no requests in hand."""
        self._view[2 * slot] = 0
        self._view[2 * slot + 1] = 0

    def close(self) -> None:
        """Unmap and unlink."""
        self._view.release()
        self._segment.close()
        self._segment.unlink()


class Heartbeat:
    """A child's side: advances its own slot."""

    __slots__ = ("_segment", "_slot", "_view")

    def __init__(self, name: str, slot: int) -> None:
        self._segment = Segment.open(name)
        self._view = memoryview(self._segment.buf).cast("Q")
        self._slot = slot

    def beat(self) -> None:
        self._view[2 * self._slot] = time.monotonic_ns()

    def set_handling(self, value: bool) -> None:
        self._view[2 * self._slot + 1] = int(value)

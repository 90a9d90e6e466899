"""Heartbeats in shared memory: three u64 slots per child.

* the last beat: ``time.monotonic_ns()`` (CLOCK_MONOTONIC, the same clock in
  every process), advanced by the child's idle timer and every receive and send;
* "handling requests since": the time the child took client requests in hand
  (a tokenizer batch, a scheduler step), 0 while it has none
  (``Heartbeat.set_handling``);
* "going down since": the time an exception reached the child's top level
  (or its run ended), 0 while it runs (``Heartbeat.set_going_down``).

**Liveness is progress.** While the child has requests in hand, its progress
dates from the earlier of its last beat and the moment it took them, however
fast its timer beats meanwhile: work on requests runs on a worker thread
(a scheduler's forward pass, a long tokenizer batch) while the trio thread
keeps beating, and a worker thread stuck there is a hang all the same. So one
unit of work on requests that lasts longer than ``watchdog_timeout`` makes
:meth:`HeartbeatTable.age` pass the timeout and the supervisor kills the
child, charging the death to those requests (below). A legitimate step must
finish within the watchdog timeout (chunked prefill bounds a step).

The handling slot also says whom a death is charged to: an abnormal exit
while it is set is charged to those requests (poison marks, quarantine), not
to the child's restart intensity, so a stream of poison requests cannot stop
the engine (``Supervisor`` reads it at each exit).

The going-down slot lets the supervisor's status say "crashing" the moment the
child knows it is dying, not only once it has unwound and exited (which takes
a heavy interpreter up to seconds).

Every store is one aligned 8-byte write through a ``'Q'``-cast memoryview,
never ``struct.pack_into``, which zeroes the field first and lets a reader
see a torn 0 (see DESIGN.md, Rings).
"""

from __future__ import annotations

import time

from rt.shm.segment import Segment

# what ActorContext.progress dates a unit of work before its beat: more than the
# frontend's AT_WORK_S, so that a child at work on its requests is seen so
PROGRESS_BACKDATE_S = 0.1
# a start-up may go without a beat for this share of its startup_timeout, or the
# watchdog's timeout if longer: a hang is found after 60 s, not 600 s, for the
# scheduler, and a start-up that holds its trio thread or the GIL for seconds (a
# load done in place, CUDA's initialisation) is no hang
STARTUP_SILENCE_SHARE = 0.1
MAX_BEAT_INTERVAL_S = 1.0  # a child's timer beats at least this often (see SILENT_AFTER_S)
_FIELDS = 3  # u64 per child: last beat, handling since, going down since
_BEAT, _HANDLING, _DOWN = range(_FIELDS)


class HeartbeatTable:
    """The parent's side: owns the segment, reads every slot."""

    def __init__(self, segment: Segment, slots: int) -> None:
        self._segment = segment
        self._view = memoryview(segment.buf).cast("Q")
        self.slots = slots

    @classmethod
    def create(cls, prefix: str, slots: int, tag: str = "hb") -> HeartbeatTable:
        return cls(Segment.create(f"{prefix}_{tag}", 8 * _FIELDS * max(slots, 1)), slots)

    @property
    def name(self) -> str:
        return self._segment.name

    def last_beat_ns(self, slot: int) -> int:
        return int(self._view[_FIELDS * slot + _BEAT])

    def age(self, slot: int, since_ns: int = 0) -> float:
        """Seconds without progress: since the later of ``since_ns`` and the
        slot's last beat, or, while the child has requests in hand, the earlier
        of that beat and the moment it took them (see the module docstring)."""
        base = _FIELDS * slot
        progress = int(self._view[base + _BEAT])
        handling_since = int(self._view[base + _HANDLING])
        if handling_since:
            progress = min(progress, handling_since)
        last = max(progress, since_ns)
        return max(0.0, (time.monotonic_ns() - last) / 1e9)

    def silence(self, slot: int, since_ns: int = 0) -> float:
        """Seconds since the later of ``since_ns`` and the slot's last beat,
        requests in hand or not: how long the process has shown no sign of life."""
        last = max(int(self._view[_FIELDS * slot + _BEAT]), since_ns)
        return max(0.0, (time.monotonic_ns() - last) / 1e9)

    def stuck_starting(self, slot: int, timeout: float) -> str | None:
        """Why a child in its start-up counts as stuck: it began to beat, then beat no
        more for ``timeout`` (its trio thread held: see STARTUP_SILENCE_SHARE); None
        if not (yet)."""
        last = int(self._view[_FIELDS * slot + _BEAT])
        silence = (time.monotonic_ns() - last) / 1e9
        return f"no heartbeat for {silence:.2f} s" if last and silence > timeout else None

    def handling_age(self, slot: int) -> float | None:
        """Seconds since the child took the requests it has in hand; None if none."""
        since = int(self._view[_FIELDS * slot + _HANDLING])
        return max(0.0, (time.monotonic_ns() - since) / 1e9) if since else None

    def handling(self, slot: int) -> bool:
        """Whether the child said it had client requests in hand (read it at its exit)."""
        return bool(self._view[_FIELDS * slot + _HANDLING])

    def going_down(self, slot: int) -> bool:
        """Whether the child said it is going down (its run raised or ended)."""
        return bool(self._view[_FIELDS * slot + _DOWN])

    def reset(self, slot: int) -> None:
        """Before a (re)start: no beat yet, no requests in hand, not going down."""
        for i in range(_FIELDS * slot, _FIELDS * (slot + 1)):
            self._view[i] = 0

    def close(self) -> None:
        """Unmap and unlink."""
        self._view.release()
        self._segment.close()
        self._segment.unlink()


class Heartbeat:
    """A child's side: advances its own slot."""

    __slots__ = ("_base", "_segment", "_view")

    def __init__(self, name: str, slot: int) -> None:
        self._segment = Segment.open(name)
        self._view = memoryview(self._segment.buf).cast("Q")
        self._base = _FIELDS * slot

    def beat(self, now_ns: int = 0) -> None:
        self._view[self._base + _BEAT] = now_ns or time.monotonic_ns()

    def set_handling(self, value: bool, since_ns: int = 0) -> None:
        """Requests in hand from now, or ``since_ns`` (True), or none (False)."""
        self._view[self._base + _HANDLING] = (since_ns or time.monotonic_ns()) if value else 0

    def set_going_down(self) -> None:
        """The run is over (it raised, or ended): the supervisor's status says so at once."""
        if not self._view[self._base + _DOWN]:
            self._view[self._base + _DOWN] = time.monotonic_ns()

"""An actor's view of its rings: receive and send with injection points.

:class:`Inbox` wraps a ring receiver (point ``receive`` after each frame
arrives, point ``commit`` right after a commit, point ``loop`` per ``async
for`` iteration); :class:`Outbox` wraps a
ring sender (point ``send`` before each frame leaves). Both advance the
actor's heartbeat. Frames stay in the ring until ``commit``: a frame received
but not committed when the actor dies is received again by its successor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rt.actors.faults import Faults, Verdict
from rt.errors import EndOfChannel
from rt.shm import Frame, RingReceiver, RingSender, RingStatistics, codec
from rt.shm.channel import Payload, as_chunks


def corrupt(data: Payload) -> bytearray:
    """A copy of ``data`` with its middle byte inverted (a deterministic corruption)."""
    out = bytearray()
    for chunk in as_chunks(data):
        out += chunk
    if out:
        out[len(out) // 2] ^= 0xFF
    return out


class Inbox:
    def __init__(self, name: str, rx: RingReceiver, faults: Faults, beat: Callable[[], None]):
        self.name = name
        self._rx, self._faults, self._beat = rx, faults, beat
        self._again: Frame | None = None

    async def receive(self) -> Frame:
        """The next frame. A dropped frame (fault plan) is skipped, not committed:
        it is committed with the next commit, or redelivered to a successor."""
        if self._again is not None:
            frame, self._again = self._again, None
            return frame
        while True:
            self._beat()
            frame = await self._rx.receive()
            try:
                verdict = await self._faults.point("receive")
            except BaseException:
                # Cancelled (say, during a planned delay) with the frame in hand:
                # keep it for the next receive, or it would be committed unhandled.
                self._again = frame
                raise
            out = self._apply(verdict, frame)
            if out is not None:
                return out

    def receive_nowait(self) -> Frame:
        """The next frame already in the ring, or WouldBlock / EndOfChannel. Passes
        point ``receive`` synchronously (a delay blocks the thread)."""
        if self._again is not None:
            frame, self._again = self._again, None
            return frame
        while True:
            frame = self._rx.receive_nowait()
            out = self._apply(self._faults.check("receive"), frame)
            if out is not None:
                return out

    def _apply(self, verdict: Verdict, frame: Frame) -> Frame | None:
        """What a fault plan's verdict makes of a received frame (None: dropped)."""
        if verdict is Verdict.PASS:
            return frame
        if verdict is Verdict.DUPLICATE:
            self._again = frame
            return frame
        if verdict is Verdict.CORRUPT:
            return frame._replace(data=corrupt(frame.data))
        return None

    def mark(self, frame: Frame) -> int:
        """Record that ``frame`` is being handled now; returns how many consumers in
        a row (this one included) started on this very frame: more than 1 means
        predecessors died with it in hand (see :meth:`rt.shm.RingReceiver.mark`)."""
        return self._rx.mark(frame)

    async def receive_obj(self) -> tuple[Any, Frame]:
        frame = await self.receive()
        return codec.loads(frame.data), frame

    def commit(self, frame: Frame | None = None) -> None:
        """Release every frame up to and including ``frame`` (default: all received),
        then pass point ``commit`` (synchronously: a death just after a commit)."""
        self._rx.commit(frame)
        self._faults.check("commit")

    def statistics(self) -> RingStatistics:
        return self._rx.statistics()

    def close(self) -> None:
        self._rx.close()

    def __aiter__(self) -> Inbox:
        return self

    async def __anext__(self) -> Frame:
        await self._faults.point("loop")
        try:
            return await self.receive()
        except EndOfChannel:
            raise StopAsyncIteration from None


class Outbox:
    def __init__(self, name: str, tx: RingSender, faults: Faults, beat: Callable[[], None]):
        self.name = name
        self._tx, self._faults, self._beat = tx, faults, beat

    async def send(self, data: Payload) -> None:
        """Send one frame, waiting for room (backpressure)."""
        self._beat()
        verdict = await self._faults.point("send")
        if verdict is Verdict.DROP:
            return
        await self._tx.send(corrupt(data) if verdict is Verdict.CORRUPT else data)
        if verdict is Verdict.DUPLICATE:
            await self._tx.send(data)

    async def send_obj(self, obj: Any) -> None:
        await self.send(codec.dumps(obj))

    def statistics(self) -> RingStatistics:
        return self._tx.statistics()

    def close(self) -> None:
        self._tx.close()

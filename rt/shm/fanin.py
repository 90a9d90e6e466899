"""One consumer reading several producer rings fairly.

The rings share one data doorbell (``Ring.create(..., data_bell=bell)``), so
the consumer parks on a single fd whichever producer wakes it. Receiving
rotates its starting ring after every frame, so a busy producer cannot
starve a quiet one.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from rt.errors import Broken, EndOfChannel, WouldBlock
from rt.shm.channel import RingReceiver
from rt.shm.ring import Frame, RingSpec, RingStatistics
from rt.shm.waiter import Waiter


class FanInReceiver:
    """Receives from several rings; ``frame.source`` says which, ``commit(frame)`` releases it."""

    def __init__(self, receivers: Sequence[RingReceiver]) -> None:
        self._fd = _shared_doorbell([rx.spec for rx in receivers])
        self._rings = list(receivers)
        for i, rx in enumerate(self._rings):
            rx.source = i
        self._next = 0
        self._waiter = Waiter(self._fd, self._set_sleeping, self._peer_fds)

    @classmethod
    def attach(cls, specs: Sequence[RingSpec]) -> FanInReceiver:
        _shared_doorbell(specs)
        return cls([RingReceiver.attach(spec, i) for i, spec in enumerate(specs)])

    def receive_nowait(self) -> Frame:
        n = len(self._rings)
        ended = 0
        for k in range(n):
            i = (self._next + k) % n
            try:
                frame = self._rings[i].receive_nowait()
            except WouldBlock:
                continue
            except EndOfChannel:
                ended += 1
                continue
            self._next = i + 1
            return frame
        if ended == n:
            raise EndOfChannel("every sender of this fan-in closed its ring")
        raise WouldBlock("every ring of this fan-in is empty")

    async def receive(self) -> Frame:
        await trio.lowlevel.checkpoint_if_cancelled()
        parked = False
        while True:
            try:
                frame = self.receive_nowait()
                break
            except WouldBlock:
                # (also after a wake: a closed sender's successor may have attached,
                # clearing the flag that woke us, before we read; wait again)
                for rx in self._rings:
                    rx.release_producer()
                parked = await self._waiter.wait(self._ready, self._check_producers) or parked
        if not parked:  # parking went through trio's scheduler already
            await trio.lowlevel.cancel_shielded_checkpoint()
        return frame

    def commit(self, frame: Frame) -> None:
        self._rings[frame.source].commit(frame)

    def statistics(self) -> tuple[RingStatistics, ...]:
        return tuple(rx.statistics() for rx in self._rings)

    def close(self) -> None:
        self._waiter.close()
        for rx in self._rings:
            rx.close()

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def _ready(self) -> bool:
        return any(rx.has_frame() or rx.peer_closed() for rx in self._rings)

    def _peer_fds(self) -> tuple[tuple[int, int], ...] | None:
        """Every producer's (pid, pidfd), or None if one cannot be watched or is
        dead (see Waiter: a dead producer's pidfd would wake the fan-in forever,
        while the others are alive and it must go on waiting)."""
        fds: list[tuple[int, int]] = []
        for rx in self._rings:
            one = rx.peer_fds()
            if one is None or not rx.peer_alive():
                return None
            fds += one
        return tuple(fds)

    def _set_sleeping(self, value: int) -> None:
        for rx in self._rings:
            rx.set_sleeping(value)

    def _check_producers(self) -> None:
        """Broken only when every producer is gone and at least one died."""
        if all(rx.producer_gone() for rx in self._rings) and not all(
            rx.peer_closed() for rx in self._rings
        ):
            raise Broken("every sending process of this fan-in is gone")


def _shared_doorbell(specs: Sequence[RingSpec]) -> int:
    if not specs:
        raise ValueError("a fan-in needs at least one ring")
    fds = {spec.data_fd for spec in specs}
    if len(fds) != 1:
        raise ValueError(f"fan-in rings must share one data doorbell, got fds {sorted(fds)}")
    return fds.pop()

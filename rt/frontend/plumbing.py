"""Small parts of the engine's frontend: the latest value of a report, to wait
on; the frontend's locked end of one ring; the messages read from a ring; and
the queue of messages its synchronous code sends.

The frontend shares its trio loop with every caller's task (and rt-serve's
connections), so under load each checkpoint on a request's path waits for a
whole round of the other runnable tasks: milliseconds. So nothing here
checkpoints per message where messages are already waiting: a ring's frames
come ``FRAME_BURST`` at a time, the queue sends whatever has been queued in one
go, and a send with room and nobody ahead of it does not hold its ring's lock
across a checkpoint. (Each of these was a queue of its own at 200 requests a
second on rt-serve: a request's first token waited ~130 ms for them;
docs/benchmarks.md.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncGenerator, Callable
from typing import Any, Generic, TypeVar

import trio

from rt import errors
from rt.pipeline.mail import unreadable_side
from rt.shm import RingReceiver, RingSender, codec
from rt.shm.channel import Payload

log = logging.getLogger(__name__)

RETRY_S = 0.02  # how often a frontend end retries a ring whose peer is restarting
FRAME_BURST = 32  # frames a ring end hands over between two checkpoints
T = TypeVar("T")


class Latest(Generic[T]):
    """The latest value of something reported now and then; wait for one you like."""

    def __init__(self) -> None:
        self.value: T | None = None
        self._changed = trio.Event()
        self.closed = False  # the engine closed: no value will come any more

    def set(self, value: T) -> None:
        self.value = value
        self.poke()

    async def wait(self, until: Callable[[T], bool]) -> T:
        while True:
            if self.closed:  # (the last value is stale: the actor that sent it is gone)
                raise errors.EngineShutdownError("the engine shut down; no report will come")
            if self.value is not None and until(self.value):
                return self.value
            await self._changed.wait()

    def close(self) -> None:
        """No more values: a waiter (now or later) gets EngineShutdownError."""
        self.closed = True
        self.poke()

    def poke(self) -> None:
        """Wake the waiters to look again (something ``until`` reads changed)."""
        self._changed.set()
        self._changed = trio.Event()


class Out:
    """The frontend's end of one ring, with the lock every sender takes."""

    def __init__(self, tx: RingSender) -> None:
        self.tx = tx
        self.lock = trio.Lock()

    def send_now(self, msg: Any) -> bool:
        """Send ``msg`` at once if nobody is sending or waiting to and the ring
        has room; False (nothing sent) otherwise. Not a checkpoint."""
        return self._send_now(codec.dumps(msg))

    def _send_now(self, data: Payload) -> bool:
        if self.lock.locked():
            return False
        try:
            self.tx.send_nowait(data)
        except (errors.WouldBlock, errors.Broken, errors.ResourceExhausted):
            return False  # full, its reader restarting, or /dev/shm full: send() waits
        return True

    async def send(
        self, msg: Any, patient: bool = True, then: Callable[[], None] | None = None
    ) -> None:
        """Send ``msg``, waiting out a restarting reader; and, ``patient``, a /dev/shm
        or fd table that stays full (else ResourceExhausted after the ring's wait).
        ``then`` is called as soon as the frame is in the ring, before any other
        sender's can follow it: in the ring's order (senders that count their
        frames after ``send`` returns count them in the order trio wakes them)."""
        data = codec.dumps(msg)
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._send_now(data):  # (the lock is not held across the checkpoint after)
            if then is not None:
                then()
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        async with self.lock:  # (no sender writes while it is held: _send_now looks)
            while True:
                try:
                    await self.tx.send(data)
                    if then is not None:
                        then()
                    return
                except errors.Broken:  # the reader died with the ring full: wait for its successor
                    await trio.sleep(RETRY_S)
                except errors.ResourceExhausted as err:
                    if not patient or not err.fits_ever:
                        raise


async def frames(rx: RingReceiver) -> AsyncGenerator[Any, None]:
    """Each message of ``rx``, committed once handled (the caller's loop body);
    waits out a restarting peer. Frames already in the ring come up to
    FRAME_BURST in a row without a checkpoint."""
    tries = burst = 0
    while True:
        try:
            data = _ready(rx) if burst < FRAME_BURST else None
            if data is None:
                data = await rx.receive_data()
                burst = 0
            burst += 1
        except (errors.Broken, errors.EndOfChannel):  # the sender is restarting
            await trio.sleep(RETRY_S)
            continue
        except errors.SegmentError as err:  # a side frame's: no fd now, or lost (resent)
            tries = await unreadable_side(rx.spec.name, err, tries)
            continue
        tries = 0
        try:
            msg = codec.loads(data)
        except Exception as err:  # corruption: drop it, never stop the engine on it
            log.error("%s: dropped a frame that does not decode: %r", rx.spec.name, err)
            rx.commit()
            continue
        yield msg
        rx.commit()


def _ready(rx: RingReceiver) -> bytes | bytearray | None:
    """The next frame's payload if one is in the ring, else None."""
    try:
        return rx.receive_data_nowait()
    except errors.WouldBlock:
        return None


class Controls:
    """Messages the frontend's synchronous code sends (stream opens and closes,
    aborts, finishes, controls): queued without waiting, sent in order by one
    task per ring (started by :meth:`run` as rings are first named). What was
    queued meanwhile goes in one go, each message straight into its ring where
    it has room. A ring whose reader lags holds up its own messages alone: with
    one queue for all, the aborts of a client that left 100 prompts of n=1024
    waited behind their 102,400 stream opens for a busy detokenizer, and the
    scheduler ran them on for 18 s."""

    def __init__(self) -> None:
        self._queues: dict[Out, trio.MemorySendChannel[Any]] = {}
        self._new, self._news = trio.open_memory_channel[
            tuple[Out, trio.MemoryReceiveChannel[Any]]
        ](math.inf)

    def queue(self, out: Out, msg: Any) -> None:
        queue = self._queues.get(out)
        if queue is None:
            queue, pending = trio.open_memory_channel[Any](math.inf)
            self._queues[out] = queue
            self._new.send_nowait((out, pending))
        queue.send_nowait(msg)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            async for out, pending in self._news:
                nursery.start_soon(_send_all, out, pending)


async def _send_all(out: Out, pending: trio.MemoryReceiveChannel[Any]) -> None:
    async for msg in pending:
        await _deliver(out, msg)
        while True:
            try:
                msg = pending.receive_nowait()
            except trio.WouldBlock:
                break
            await _deliver(out, msg)


async def _deliver(out: Out, msg: Any) -> None:
    try:
        if not out.send_now(msg):
            await out.send(msg)
    except errors.ResourceExhausted as err:  # never fits: its request stalls, is resent
        log.error("%s: dropped a %s: %s", out.tx.spec.name, type(msg).__name__, err)

"""Two small parts of the engine's frontend: the latest value of a report, to
wait on, and the frontend's locked end of one ring."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import trio

from rt import errors
from rt.shm import RingSender, codec

RETRY_S = 0.02  # how often a frontend end retries a ring whose peer is restarting
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
        while self.value is None or not until(self.value):
            if self.closed:
                raise errors.EngineShutdownError("the engine shut down; no report will come")
            await self._changed.wait()
        return self.value

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

    async def send(self, msg: Any, patient: bool = True) -> None:
        """Send ``msg``, waiting out a restarting reader; and, ``patient``, a /dev/shm
        or fd table that stays full (else ResourceExhausted after the ring's wait)."""
        data = codec.dumps(msg)
        async with self.lock:
            while True:
                try:
                    await self.tx.send(data)
                    return
                except errors.Broken:  # the reader died with the ring full: wait for its successor
                    await trio.sleep(RETRY_S)
                except errors.ResourceExhausted as err:
                    if not patient or not err.fits_ever:
                        raise

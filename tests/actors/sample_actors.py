"""Actors for the tests: importable by the child (the parent's sys.path travels)."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time
from pathlib import Path

import trio

from rt.actors import Actor, ActorContext
from rt.errors import ConfigError


class Idle(Actor):
    """Does nothing until stopped; passes point ``loop`` every ``period`` seconds."""

    def __init__(self, period: float = 0.05) -> None:
        self.period = period

    async def run(self, ctx: ActorContext) -> None:
        while True:
            await ctx.tick()
            await trio.sleep(self.period)


class GatedStartup(Idle):
    """An :class:`Idle` whose start-up in incarnation ``held`` lasts until the file
    ``gate`` exists: a start-up as slow as the test needs, whatever the machine's load."""

    def __init__(self, gate: str, held: int) -> None:
        super().__init__()
        self.gate, self.held = Path(gate), held

    async def startup(self, ctx: ActorContext) -> None:
        if ctx.incarnation == self.held:
            while not self.gate.exists():
                await trio.sleep(0.01)


class ExitAfter(Actor):
    """Exits with ``code`` after ``delay`` seconds (0: a clean exit)."""

    def __init__(self, code: int = 0, delay: float = 0.0) -> None:
        self.code, self.delay = code, delay

    async def run(self, ctx: ActorContext) -> None:
        await trio.sleep(self.delay)
        if self.code:
            raise SystemExit(self.code)


class FailingStartup(Actor):
    def __init__(self) -> None:
        raise RuntimeError("this actor cannot start: boom")


class RefusesItsConfig(Actor):
    def __init__(self) -> None:
        raise ConfigError("this actor's options are wrong: size=-1")


class ExitsInItsStartup(Idle):
    async def startup(self, ctx: ActorContext) -> None:
        sys.exit(3)


class BlocksItsStartup(Idle):
    """Holds its trio thread ``seconds`` in its start-up (a load done in place)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    async def startup(self, ctx: ActorContext) -> None:
        time.sleep(self.seconds)


class FailsItsFirstStart(Idle):
    """Raises at its first start (it leaves ``marker`` behind), then starts."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("not this time")


class IgnoresSigterm(Actor):
    async def run(self, ctx: ActorContext) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            await ctx.tick()
            await trio.sleep(0.05)


class Forward(Actor):
    """Forwards every frame of inbox ``in`` to outbox ``out`` as
    ``data|offset|incarnation|marks``, then commits it."""

    fault_points = frozenset({"step"})

    async def run(self, ctx: ActorContext) -> None:
        inbox, outbox = ctx.inbox["in"], ctx.outbox["out"]
        async for frame in inbox:
            marks = inbox.mark(frame)  # 2: a predecessor died with this frame in hand
            await ctx.faults.point("step")
            suffix = b"|%d|%d|%d" % (frame.offset, ctx.incarnation, marks)
            await outbox.send([bytes(frame.data), suffix])
            inbox.commit(frame)


class SelfKill(Actor):
    async def run(self, ctx: ActorContext) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class BlocksSigterm(Actor):
    """Blocks SIGTERM before it reports ready, so the signal never lands."""

    def __init__(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    async def run(self, ctx: ActorContext) -> None:
        while True:
            await ctx.tick()
            await trio.sleep(0.05)


class DiesWithRequests(Actor):
    """Dies at once, by ``os._exit(1)`` or (``sigkill``) SIGKILL: inside
    ``ctx.handling_requests()`` while its incarnation is at most ``flagged_until``,
    outside it (idle) after that."""

    def __init__(self, flagged_until: int = 1 << 30, sigkill: bool = False) -> None:
        self.flagged_until, self.sigkill = flagged_until, sigkill

    async def run(self, ctx: ActorContext) -> None:
        if ctx.incarnation > self.flagged_until:
            self._die()
        with ctx.handling_requests():
            self._die()

    def _die(self) -> None:
        if self.sigkill:
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(1)


class RaisesInANursery(Actor):
    """Raises ``ValueError("boom")`` from a task of a nursery, beside a sleeping one."""

    async def run(self, ctx: ActorContext) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            nursery.start_soon(_boom)


async def _boom() -> None:
    await trio.sleep(0.01)
    raise ValueError("boom")


class WorksInAThread(Actor):
    """Handles "requests" in a worker thread, its trio thread free (so its
    heartbeat timer goes on): ``units`` units of ``seconds`` each in incarnation 1
    (then it idles), the last one stuck for good when ``stuck``."""

    def __init__(self, seconds: float, units: int, stuck: bool = False) -> None:
        self.seconds, self.units, self.stuck = seconds, units, stuck

    async def run(self, ctx: ActorContext) -> None:
        if ctx.incarnation == 1:
            for unit in range(self.units):
                forever = self.stuck and unit == self.units - 1
                with ctx.handling_requests():
                    await trio.to_thread.run_sync(time.sleep, 3600 if forever else self.seconds)
        await trio.sleep_forever()


class SlowToDie(Actor):
    """Raises in incarnation 1, then does not finish exiting until the file
    ``gate`` exists (a teardown as slow as the test needs: a process holding
    torch takes up to seconds); idles after."""

    def __init__(self, gate: str) -> None:
        self.gate = Path(gate)

    async def run(self, ctx: ActorContext) -> None:
        if ctx.incarnation == 1:
            atexit.register(_wait_for_file, self.gate)
            raise RuntimeError("boom, slowly")
        await trio.sleep_forever()


def _wait_for_file(path: Path) -> None:
    while not path.exists():
        time.sleep(0.01)

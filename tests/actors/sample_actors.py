"""Actors for the tests: importable by the child (the parent's sys.path travels)."""

from __future__ import annotations

import os
import signal

import trio

from rt.actors import Actor, ActorContext


class Idle(Actor):
    """Does nothing until stopped; passes point ``loop`` every ``period`` seconds."""

    def __init__(self, period: float = 0.05) -> None:
        self.period = period

    async def run(self, ctx: ActorContext) -> None:
        while True:
            await ctx.tick()
            await trio.sleep(self.period)


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

"""The actor base class and the context a child hands it.

An actor is constructed in its child process from its spec's factory and
arguments (construction and :meth:`Actor.startup` are its start-up: if they
raise, the supervisor gets :class:`~rt.errors.ActorStartupError` with the
traceback), then :meth:`Actor.run` runs under ``trio.run`` until it returns
(a normal exit), raises (a crash; but ``EndOfChannel``, a producer that closed
its ring cleanly, is a normal exit), or the supervisor sends SIGTERM (run is
cancelled, a normal exit)::

    class Echo(Actor):
        fault_points = frozenset({"step"})   # points of its own, beyond the built-in ones

        async def run(self, ctx: ActorContext) -> None:
            async for frame in ctx.inbox["in"]:
                ctx.faults.check("step")
                await ctx.outbox["out"].send(frame.data)
                ctx.inbox["in"].commit(frame)
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import ClassVar

from rt.actors.faults import Faults
from rt.actors.heartbeat import PROGRESS_BACKDATE_S, Heartbeat
from rt.actors.mailbox import Inbox, Outbox


class ActorContext:
    """What an actor sees of the runtime: its name, incarnation, rings, faults.

    ``incarnation`` is 1 for the first start and grows by one per restart.
    ``beat()`` advances the heartbeat; receiving and sending do it too, and a
    timer does it every ``watchdog_timeout / 5`` while trio's loop is free, so
    only an actor that blocks its trio thread needs to call it (it cannot).
    Beats do not cover work on requests: inside :meth:`handling_requests`
    the actor's progress dates from when the work began, so work that takes
    longer than ``watchdog_timeout``, on any thread, is a hang.
    """

    def __init__(
        self,
        name: str,
        incarnation: int,
        faults: Faults,
        heartbeat: Heartbeat | None,
        inbox: Mapping[str, Inbox],
        outbox: Mapping[str, Outbox],
    ) -> None:
        self.name = name
        self.incarnation = incarnation
        self.faults = faults
        self.inbox = inbox
        self.outbox = outbox
        self._heartbeat = heartbeat
        self._in_hand = False  # inside handling_requests

    def beat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.beat()

    @contextmanager
    def handling_requests(self) -> Iterator[None]:
        """Wrap work on client requests (a tokenizer batch, a scheduler step): a
        death inside is charged to those requests (poison marks, quarantine), not
        to this actor's restart intensity; so is an exception escaping it (the
        flag stays set: the actor is about to die of it). The work must end
        within ``watchdog_timeout``, however fast the heartbeat goes meanwhile:
        one that takes longer is a hang (the supervisor kills the actor and
        charges the death to those requests). Wrap the work alone, nothing that
        waits for a peer (a send on a full ring). Not reentrant."""
        if self._heartbeat is None:
            yield
            return
        self._heartbeat.set_handling(True)
        self._in_hand = True
        try:
            yield
        except Exception:
            raise
        except BaseException:  # cancelled (stopping): not a crash
            self._heartbeat.set_handling(False)
            raise
        finally:
            self._in_hand = False
        self._heartbeat.set_handling(False)

    def progress(self) -> None:
        """Inside :meth:`handling_requests`: a bounded unit of the work in hand
        starts (a tokenizer's render of one chat template, time-limited), so the
        watchdog's count starts again from now, and the child beats. The work is
        dated a little before the beat (``PROGRESS_BACKDATE_S``): requests taken
        before the last beat are what tells the frontend this child is at work,
        not lost (it sends it no copies, rt/frontend/tokenizer_queues.py)."""
        if self._heartbeat is not None and self._in_hand:
            now = time.monotonic_ns()
            self._heartbeat.beat(now)
            self._heartbeat.set_handling(True, now - int(PROGRESS_BACKDATE_S * 1e9))

    async def tick(self) -> None:
        """One iteration of an actor's own loop: heartbeat, then point ``loop``."""
        self.beat()
        await self.faults.point("loop")


class Actor:
    """Subclass and implement :meth:`run`. ``fault_points`` names the injection
    points the actor passes beyond ``startup``, ``receive``, ``send``, ``loop``,
    so a fault plan naming an unknown point is refused at start."""

    fault_points: ClassVar[frozenset[str]] = frozenset()

    async def startup(self, ctx: ActorContext) -> None:
        """Anything slow before the actor is ready (loading a model). Optional. The
        child beats meanwhile on its trio thread: work that holds that thread longer
        than a tenth of ``startup_timeout`` (and the watchdog's timeout) is taken for
        a hang, so run it on a worker thread (``trio.to_thread.run_sync``)."""

    async def run(self, ctx: ActorContext) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement async run(ctx)")

"""The supervisor: a trio task tree that owns every child process and ring.

One task per running child waits on its pidfd (exit is seen at once) and watches its
heartbeat (a hang is seen after ``watchdog_timeout``; so is one unit of work on
requests in flight that long, on whatever thread: see :mod:`rt.actors.heartbeat`);
both post an exit event. A child whose run raised says so before it unwinds:
:meth:`Supervisor.status` shows it EXITING at once, before its exit is seen. One task
decides, event by event: the restart type, the intensity, the strategy and the backoff
(pure decisions in :mod:`rt.actors.policy`). The restarts run as tasks of their own,
so one child's backoff or slow start-up delays no other child: under ``one_for_one``
each child's restarts run in order on a lane of their own; under ``one_for_all`` and
``rest_for_one``, whose groups always overlap, every restart runs in order on one
lane, each stopping its group in reverse start order, then starting it in start order.

An abnormal exit while the child had client requests in hand (the slot in its
heartbeat, :mod:`rt.actors.heartbeat`) is charged to those requests, which the actors
isolate and refuse themselves: the child is restarted, with at most the initial
backoff, and the exit not counted toward the intensity (a stream of poison requests
never escalates).

A child that is a :class:`SupervisorSpec` runs as a sub-supervisor in this process; it
fails, as one child, when it escalates. The root creates every ring of the tree, so a
restarted subtree reattaches to the same rings.

Cancelling :meth:`Supervisor.run` (or SIGINT/SIGTERM with ``handle_signals``) stops
the tree depth first in reverse start order, each actor by SIGTERM then SIGKILL after
its grace period, and unlinks every segment (the rings once :func:`open_supervisor`'s
body has exited; a root killed outright leaves them to :mod:`rt.shm.reaper`'s).
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from rt.actors.boot import ChildBoot
from rt.actors.faultplan import FaultPlan
from rt.actors.heartbeat import MAX_BEAT_INTERVAL_S, STARTUP_SILENCE_SHARE, HeartbeatTable
from rt.actors.policy import Backoff, RestartIntensity, affected, should_restart
from rt.actors.process import ChildProcess, describe_exit, spawn
from rt.actors.spec import ActorSpec, Restart, Strategy, SupervisorSpec
from rt.actors.status import ActorState, ActorStatus, SupervisorStatus
from rt.errors import ActorStartupError, EscalationError
from rt.shm import Ring
from rt.shm.reaper import Reaper, keep_reaping
from rt.shm.segment import new_run_prefix, sweep

log = logging.getLogger("rt.actors")


@dataclass(eq=False)
class _Child:
    """The supervisor's mutable record of one child (private; see ActorStatus)."""

    index: int
    spec: ActorSpec | SupervisorSpec
    backoff: Backoff
    state: ActorState = ActorState.STARTING
    proc: ChildProcess | None = None  # an actor's process
    sub: Supervisor | None = None  # a subtree's supervisor (the latest incarnation's)
    scope: trio.CancelScope | None = None  # a running subtree's: cancel to stop it
    done: trio.Event | None = None  # set when the running subtree's task has finished
    incarnation: int = 0
    live: bool = False  # the current incarnation's exit is still to be handled
    restart_count: int = 0
    request_crashes: int = 0  # abnormal exits charged to the requests it had in hand
    reasons: deque[str] = field(default_factory=lambda: deque(maxlen=5))
    ready_at: float | None = None
    ready_ns: int = 0
    last_exit_at: float | None = None


@dataclass(frozen=True)
class _Exit:
    index: int
    incarnation: int
    reason: str
    abnormal: bool
    at: float
    error: BaseException | None = None
    with_requests: bool = False  # abnormal, with client requests in hand


@dataclass(frozen=True)
class _Restart:
    failed: _Child
    event: _Exit
    delay: float  # the backoff before starting again


class Supervisor:
    """Runs a :class:`SupervisorSpec`. Start it with ``await nursery.start(sup.run)``
    or ``async with open_supervisor(spec) as sup``; read :meth:`status`."""

    def __init__(
        self,
        spec: SupervisorSpec,
        *,
        fault_plan: FaultPlan | None = None,
        handle_signals: bool = False,
        _parent: Supervisor | None = None,
    ) -> None:
        self.spec = spec
        self._parent = _parent
        self.fault_plan: FaultPlan | None
        if _parent is not None:  # a subtree: the root checked the tree and owns the rings
            self.fault_plan = _parent.fault_plan
            self._rings: dict[str, Ring] = _parent._rings
        else:
            spec.check_tree()
            self.fault_plan = fault_plan if fault_plan is not None else FaultPlan.from_env()
            if self.fault_plan is not None:
                self.fault_plan.check_actors(spec.actors())
            self._rings = {}
        self._reaper: Reaper | None = None  # the root's (rt/shm/reaper.py)
        self._handle_signals = handle_signals
        self._children = [
            _Child(i, c, Backoff(spec.backoff_initial, spec.backoff_max, spec.backoff_reset))
            for i, c in enumerate(spec.children)
        ]
        self._intensity = RestartIntensity(spec.max_restarts, spec.max_seconds)
        self._heartbeats: HeartbeatTable | None = None
        self._escalation: EscalationError | None = None
        self._changed = trio.Event()
        self._events: trio.MemorySendChannel[_Exit] | None = None
        self._nursery: trio.Nursery | None = None
        self._running = self._started = False
        self.prefix = ""

    # -- the public surface ---------------------------------------------------

    def status(self) -> SupervisorStatus:
        return SupervisorStatus(
            name=self.spec.name,
            strategy=self.spec.strategy.value,
            actors=tuple(
                ActorStatus(
                    name=c.spec.name,
                    pid=c.proc.pid if c.proc is not None else None,
                    state=self._state(c),
                    incarnation=c.incarnation,
                    restart_count=c.restart_count,
                    last_exit_reason=c.reasons[-1] if c.reasons else None,
                    ready_at=c.ready_at,
                    last_exit_at=c.last_exit_at,
                    request_crashes=c.request_crashes,
                    **self._ages(c),
                )
                for c in self._children
            ),
            running=self._running,
            restarts_in_window=self._intensity.recent(time.monotonic()),
            escalated=str(self._escalation) if self._escalation else None,
            subtrees=tuple(c.sub.status() for c in self._children if c.sub is not None),
        )

    def _ages(self, c: _Child) -> dict[str, float | None]:
        hb, names = self._heartbeats, ("heartbeat_age", "beat_age", "handling_age")
        if hb is None or c.state is not ActorState.RUNNING:
            return dict.fromkeys(names)
        i, ready = c.index, c.ready_ns
        ages = (hb.age(i, ready), hb.silence(i, ready), hb.handling_age(i))
        return dict(zip(names, ages, strict=True))

    def _state(self, child: _Child) -> ActorState:
        """``child.state``, but EXITING once a running child said it is going down,
        or has died (its exit, seen later, is what the supervisor acts on)."""
        hb = self._heartbeats
        running = child.state is ActorState.RUNNING and child.live  # (else being stopped)
        saying = hb is not None and hb.going_down(child.index)
        if running and child.proc is not None and (saying or child.proc.has_exited()):
            return ActorState.EXITING
        return child.state

    async def wait_for(self, predicate: Callable[[SupervisorStatus], bool]) -> SupervisorStatus:
        """Wait until ``predicate(self.status())`` holds (checked at every change)."""
        while True:
            status = self.status()
            if predicate(status):
                return status
            await self._changed.wait()

    def ring(self, name: str) -> Ring:
        """The :class:`rt.shm.Ring` declared as ``name``, to attach the parent's end
        to. Under :func:`open_supervisor` the rings stay open until its body has
        exited, so close your ends in the body (a ``finally`` is fine); a supervisor
        started with ``nursery.start(sup.run)`` unlinks them when ``run`` returns:
        close your ends before."""
        try:
            return self._rings[name]
        except KeyError:
            raise KeyError(f"no ring {name!r} (is the supervisor running?)") from None

    async def run(
        self, *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Start every child, supervise until cancelled, then stop everything and
        unlink every segment. Raises EscalationError (after the clean shutdown) if
        the intensity is exceeded. A supervisor runs once; build a new one to run again."""
        await self._run(close_rings=True, task_status=task_status)

    async def _run(
        self,
        *,
        close_rings: bool,
        task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """:meth:`run`. ``close_rings=False`` leaves the root's rings open for
        :meth:`_close_rings` (open_supervisor's, once its body has exited)."""
        if self._nursery is not None:
            raise RuntimeError(f"supervisor {self.spec.name!r} has already run; make a new one")
        if self._parent is None:
            sweep()
            self.prefix = new_run_prefix()
            self._reaper = Reaper(self.prefix)  # for a root killed outright
        else:
            self.prefix = self._parent.prefix
        send, receive = trio.open_memory_channel[_Exit](math.inf)
        self._events = send
        try:
            self._open_segments()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    if self._handle_signals:
                        nursery.start_soon(self._stop_on_signal, nursery.cancel_scope)
                    if self._reaper is not None:
                        nursery.start_soon(keep_reaping, self._reaper)
                    for child in self._children:
                        await self._start(child)
                    self._running = self._started = True
                    self._notify()
                    task_status.started(self)
                    await self._supervise(receive)
                finally:
                    # Inside the nursery, so running subtrees (shielded) stop in order too.
                    self._running = False
                    with trio.CancelScope(shield=True):
                        await self._stop_children()
                    nursery.cancel_scope.cancel()
        finally:
            self._close_heartbeats()
            if close_rings:
                self._close_rings()
        if self._escalation is not None:
            raise self._escalation

    # -- starting and watching ------------------------------------------------

    def _open_segments(self) -> None:
        tag = f"hb_{self.spec.name}"
        self._heartbeats = HeartbeatTable.create(self.prefix, len(self._children), tag)
        if self._parent is None:
            for decl in self.spec.all_rings():
                self._rings[decl.name] = Ring.create(self.prefix, decl.name, decl.capacity)

    def _close_heartbeats(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.close()
            self._heartbeats = None
        self._notify()

    def _close_rings(self) -> None:
        """Unlink the rings and close their doorbells (the root's: it owns them)."""
        if self._parent is None:
            for ring in self._rings.values():
                ring.close()
            if self._reaper is not None:
                self._reaper.close()

    def _watchdog_timeout(self, spec: ActorSpec) -> float:
        return spec.watchdog_timeout or self.spec.watchdog_timeout

    async def _start(self, child: _Child) -> None:
        assert self._heartbeats is not None and self._events is not None
        child.incarnation += 1
        child.state = ActorState.STARTING
        child.live = True
        self._notify()
        if isinstance(child.spec, SupervisorSpec):
            await self._start_subtree(child)
            return
        spec, watchdog = child.spec, self._watchdog_timeout(child.spec)
        silence = max(watchdog, spec.startup_timeout * STARTUP_SILENCE_SHARE)
        self._heartbeats.reset(child.index)  # no beat yet, no requests in hand
        boot = ChildBoot(
            name=spec.name,
            factory=spec.factory,
            args=spec.args,
            kwargs=dict(spec.kwargs),
            incarnation=child.incarnation,
            heartbeat_segment=self._heartbeats.name,
            heartbeat_slot=child.index,
            heartbeat_interval=min(watchdog / 5, MAX_BEAT_INTERVAL_S),
            inboxes={r: self._rings[r].spec for r in spec.inboxes},
            outboxes={r: self._rings[r].spec for r in spec.outboxes},
            fault_plan=self.fault_plan,
        )
        fds = [fd for r in (*spec.inboxes, *spec.outboxes) for fd in self._rings[r].fds]
        try:
            proc = await spawn(
                boot,
                pass_fds=fds,
                env=spec.env,
                startup_timeout=spec.startup_timeout,
                cpus=spec.cpus,
                stuck=partial(self._heartbeats.stuck_starting, child.index, silence),
            )
        except ActorStartupError as err:
            first_line = str(err).partition("\n")[0]  # the traceback follows it
            reason = f"startup failed: {first_line}"
            self._events.send_nowait(
                _Exit(child.index, child.incarnation, reason, True, time.monotonic(), err)
            )
            return
        child.proc, child.state = proc, ActorState.RUNNING
        child.ready_ns = time.monotonic_ns()
        child.ready_at = child.ready_ns / 1e9
        log.info("actor %r ready (pid %d, incarnation %d)", spec.name, proc.pid, child.incarnation)
        assert self._nursery is not None
        self._nursery.start_soon(self._watch, child, proc, child.incarnation)
        self._notify()

    async def _start_subtree(self, child: _Child) -> None:
        assert isinstance(child.spec, SupervisorSpec) and self._nursery is not None
        sub = Supervisor(child.spec, _parent=self)
        child.sub, child.done = sub, trio.Event()
        await self._nursery.start(self._run_subtree, child, sub, child.incarnation, child.done)
        if sub._escalation is None:  # else its exit event is queued already
            child.state = ActorState.RUNNING
            child.ready_at = time.monotonic()
            self._notify()

    async def _run_subtree(
        self,
        child: _Child,
        sub: Supervisor,
        incarnation: int,
        done: trio.Event,
        task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """A subtree runs shielded: only :meth:`_stop_child` stops it, so a
        shutdown stops the tree depth first in reverse start order."""
        reason, abnormal, error = "stopped", False, None
        try:
            with trio.CancelScope(shield=True) as scope:
                child.scope = scope
                try:
                    await sub.run(task_status=task_status)
                except EscalationError as err:
                    reason, abnormal, error = f"escalated ({err})", True, err
                    if not sub._started:
                        task_status.started(sub)
        finally:
            if child.scope is scope:
                child.scope = None
            done.set()
        assert self._events is not None
        self._events.send_nowait(
            _Exit(child.index, incarnation, reason, abnormal, time.monotonic(), error)
        )

    async def _watch(self, child: _Child, proc: ChildProcess, incarnation: int) -> None:
        stuck: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watchdog, child, proc, stuck)
            nursery.start_soon(self._watch_going_down, proc)
            code = await proc.wait()
            nursery.cancel_scope.cancel()
        at = proc.exited_at or time.monotonic()
        abnormal = code != 0 or bool(stuck)
        reason = stuck[0] if stuck else describe_exit(code)
        if proc.error:
            reason += f" ({proc.error})"
        assert self._heartbeats is not None and self._events is not None
        # Read now: the slot is reset only when the child starts again, after this event.
        with_requests = abnormal and self._heartbeats.handling(child.index)
        if with_requests:
            reason += " (with requests in hand: not counted toward escalation)"
        self._events.send_nowait(
            _Exit(child.index, incarnation, reason, abnormal, at, with_requests=with_requests)
        )

    async def _watch_going_down(self, proc: ChildProcess) -> None:
        """Wake :meth:`wait_for` when a crashing child reports (status reads EXITING)."""
        await proc.wait_report()
        self._notify()

    async def _watchdog(self, child: _Child, proc: ChildProcess, stuck: list[str]) -> None:
        """Kill a child that made no progress for ``watchdog_timeout``: no beat, or
        one unit of work on requests in flight that long (see rt.actors.heartbeat)."""
        assert self._heartbeats is not None and isinstance(child.spec, ActorSpec)
        timeout = self._watchdog_timeout(child.spec)
        while True:
            await trio.sleep(timeout / 4)
            age = self._heartbeats.age(child.index, child.ready_ns)
            if age > timeout:
                if self._heartbeats.handling(child.index):
                    stuck.append(f"watchdog: no progress for {age:.2f} s (requests in hand)")
                else:
                    stuck.append(f"watchdog: no heartbeat for {age:.2f} s")
                log.warning(
                    "actor %r (pid %d) stuck for %.2f s (watchdog_timeout %.2f s): SIGKILL",
                    child.spec.name,
                    proc.pid,
                    age,
                    timeout,
                )
                proc.send_signal(signal.SIGKILL)
                return

    # -- deciding -------------------------------------------------------------

    async def _supervise(self, events: trio.MemoryReceiveChannel[_Exit]) -> None:
        """Decide on each exit in turn; the restarts decided run on lanes of their
        own, so the next exit is decided on at once."""
        lanes: dict[int, trio.MemorySendChannel[_Restart]] = {}
        async with trio.open_nursery() as restarts:
            async for event in events:
                restart = self._decide(event)
                if self._escalation is not None:
                    restarts.cancel_scope.cancel()  # restarts under way: everything stops
                    return
                if restart is None:
                    continue
                # Restarts whose groups overlap run in order on one lane, so no child
                # is started by two at once and a later failure's group restart comes
                # after an earlier one's. Under one_for_one a group is its child;
                # under one_for_all and rest_for_one every group holds the last child.
                lane = restart.failed.index if self.spec.strategy is Strategy.ONE_FOR_ONE else -1
                if lane not in lanes:
                    lanes[lane], queue = trio.open_memory_channel[_Restart](math.inf)
                    restarts.start_soon(self._restart_in_order, queue)
                lanes[lane].send_nowait(restart)

    def _decide(self, event: _Exit) -> _Restart | None:
        """Book one exit; the restart it calls for, if any (None also when it escalates)."""
        child = self._children[event.index]
        if not child.live or event.incarnation != child.incarnation:
            return None  # an exit the supervisor caused, or one a group restart replaces
        child.live, child.proc = False, None
        child.reasons.append(event.reason)
        child.last_exit_at = event.at
        if event.with_requests:
            child.request_crashes += 1
        if not should_restart(child.spec.restart, event.abnormal):
            child.state = ActorState.FAILED if event.abnormal else ActorState.STOPPED
            name, kind = child.spec.name, child.spec.restart.value
            log.warning("actor %r exited (%s); %s, not restarted", name, event.reason, kind)
            self._notify()
            return None
        # never up, its configuration refused: every restart would fail alike (after it has
        # been up, free memory or a device may come back: restarted as any crash)
        if child.ready_at is None and getattr(event.error, "refused", False):
            child.state = ActorState.FAILED
            self._escalate(child, event, "cannot start with this configuration")
            return None
        # the requests in hand's (poison is refused), or no process made (no fds): not counted
        if not (event.with_requests or getattr(event.error, "transient", False)) and not (
            self._intensity.record(time.monotonic(), child.spec.name)
        ):
            child.state = ActorState.FAILED
            self._escalate(child, event)
            return None
        if child.ready_at is None and child.incarnation > self.spec.max_restarts:
            child.state = ActorState.FAILED  # each start slower than the window: never trips it
            self._escalate(child, event, f"never came up in {child.incarnation} starts")
            return None
        log.warning("actor %r exited (%s): restarting", child.spec.name, event.reason)
        child.state = ActorState.RESTARTING
        for i in affected(self.spec.strategy, child.index, len(self._children)):
            other = self._children[i]
            if other.live:  # its group restart stops it: an exit before then is not its own
                other.live = False
                other.state = ActorState.RESTARTING
        ran_for = event.at - child.ready_at if child.ready_at and event.error is None else 0.0
        delay = child.backoff.next_delay(ran_for, with_requests=event.with_requests)
        self._notify()
        return _Restart(child, event, delay)

    def _escalate(self, child: _Child, event: _Exit, why: str | None = None) -> None:
        why = why or self._intensity.exceeded()
        self._escalation = EscalationError(
            f"supervisor {self.spec.name!r}: actor {child.spec.name!r} {why}; "
            f"shutting everything down. Last exit reasons of {child.spec.name!r}: "
            + "; ".join(child.reasons)
        )
        self._escalation.__cause__ = event.error
        log.error("%s", self._escalation)
        self._notify()

    async def _restart_in_order(self, queue: trio.MemoryReceiveChannel[_Restart]) -> None:
        async for restart in queue:
            await self._restart(restart)

    async def _restart(self, restart: _Restart) -> None:
        failed, event = restart.failed, restart.event
        if failed.incarnation != event.incarnation:
            # An earlier restart on this lane started it again after this exit, and
            # with it this exit's whole group (any group holding a child holds the
            # group its strategy restarts with it): nothing is left to do.
            return
        group = [
            self._children[i]
            for i in affected(self.spec.strategy, failed.index, len(self._children))
        ]
        for other in reversed(group):
            if other is not failed and (other.proc is not None or other.scope is not None):
                other.live = False
                other.state = ActorState.RESTARTING
                await self._stop_child(other)
        self._notify()
        if restart.delay:
            log.info(
                "actor %r: backing off %.2f s before restarting", failed.spec.name, restart.delay
            )
            await trio.sleep(restart.delay)
        retry = getattr(event.error, "transient", False)  # no process made: the same restart
        for member in group:
            if member.state is not ActorState.RESTARTING:
                continue
            if member is not failed and member.spec.restart is Restart.TEMPORARY:
                member.state = ActorState.STOPPED
                continue
            if not retry:  # (the group's restart goes on: counted once)
                member.restart_count += 1
            await self._start(member)

    # -- stopping -------------------------------------------------------------

    async def _stop_child(self, child: _Child) -> None:
        if child.proc is not None:
            assert isinstance(child.spec, ActorSpec)
            grace = child.spec.shutdown_grace or self.spec.shutdown_grace
            code = await child.proc.stop(grace)
            late = f", SIGKILL after {grace:g} s grace" if child.proc.killed_after_grace else ""
            child.reasons.append(f"stopped by the supervisor ({describe_exit(code)}{late})")
            child.last_exit_at = child.proc.exited_at
            child.proc = None
        if child.scope is not None and child.done is not None:
            child.scope.cancel()
            await child.done.wait()

    async def _stop_on_signal(self, cancel_scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.warning(
                    "supervisor %r: %s received, stopping",
                    self.spec.name,
                    signal.Signals(signum).name,
                )
                cancel_scope.cancel()
                return

    async def _stop_children(self) -> None:
        for child in reversed(self._children):
            child.live = False
            await self._stop_child(child)
            if child.state is not ActorState.FAILED:
                child.state = ActorState.STOPPED
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
        if self._parent is not None:  # the parent's status includes ours
            self._parent._notify()


@asynccontextmanager
async def open_supervisor(spec: SupervisorSpec, **options: Any) -> AsyncIterator[Supervisor]:
    """Run a supervisor for the body of the ``async with``; every child is ready
    on entry (one whose first start failed is restarted first), and everything
    is stopped and unlinked on exit. An escalation cancels the body and comes
    out as an ExceptionGroup holding EscalationError. The rings stay open until
    the body has exited, so the body may close the ends it attached (or send
    on them) in its own ``finally``."""
    supervisor = Supervisor(spec, **options)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(supervisor._run, close_rings=False))
            if (await supervisor.wait_for(lambda s: s.settled)).escalated is not None:
                await trio.sleep_forever()  # until _run raises it and this is cancelled
            yield supervisor
            nursery.cancel_scope.cancel()
    finally:
        # Only here: an escalation stops the children and ends ``_run`` before the
        # nursery cancels the body, whose ``finally`` may still ring the doorbells
        # of its ends (closed fds then, or worse, fd numbers reused meanwhile).
        supervisor._close_rings()

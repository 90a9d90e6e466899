"""Parking an endpoint until its condition holds: a spin, then the eventcount.

The spin's length comes from :class:`rt.shm.spin.SpinPolicy`, except where
this process and its peers may run on one CPU only (a taskset, a cpuset of
one core): there a spin can never pay, since the peer cannot answer until the
spinner stops, and every wait parks at once. On one CPU that took a ping-pong's
p99 from ~400 µs (two spinners taking turns by time slice) to ~100–180 µs, at
the cost of its p50 (~30 → ~55 µs: two parks a round trip instead of one);
docs/benchmarks.md.

Then the eventcount: set our ``sleeping`` slot, fence, re-check, and park
with ``trio.lowlevel.wait_readable``. The peer rings our doorbell only when it
sees the slot set, so a busy ring makes no system calls.

A parked endpoint must also notice that its peer died, or it would hang.
It parks on an epoll set of its own that holds the doorbell and the peer's
pidfd (readable once the process has exited), so a death wakes it at once
and an idle endpoint makes no system call at all. Where a peer cannot be
watched that way (none attached yet, or it already died and no successor
has attached), it parks with a timeout instead and checks every
``LIVENESS_S``. (A trio timeout costs ~15 µs per park on this VM, a
third of a parked round trip's overhead; the epoll set costs nothing more
than waiting on the doorbell alone.)
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Callable, Sequence

import trio

from rt.errors import Closed
from rt.shm.memory_order import fence
from rt.shm.spin import Spin, SpinPolicy, spin

LIVENESS_S = 0.2  # a parked endpoint whose peer it cannot watch checks it this often
# The cores this process may run on (a cpuset or taskset gives fewer than the machine has).
CORES = len(os.sched_getaffinity(0)) or 1
AFFINITY_S = 1.0  # how often a waiter asks again where it and its peers may run


def one_cpu(pids: Sequence[int]) -> bool:
    """May this process and every one of ``pids`` run on one and the same CPU
    only (a taskset, a cpuset of one core)? Then a spin can never pay: the
    peer it waits for cannot run until the spinner stops."""
    try:
        cpus = set(os.sched_getaffinity(0))
        for pid in pids:
            cpus |= os.sched_getaffinity(pid)
    except OSError:  # a peer that just exited: its pidfd says so
        return False
    return len(cpus) == 1


def oversubscribed() -> bool:
    """More threads runnable on this machine right now than this process has cores?
    (/proc/loadavg's fourth field counts them; read only after a spin was
    preempted, so its cost, ~10 µs, does not matter.)"""
    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return True  # cannot tell: believe the preemption
    return running > CORES


class Waiter:
    """Parks one endpoint (or a fan-in) until its condition holds, after a spin
    its :class:`SpinPolicy` sizes. Counts the times it slept.

    ``peer_fds()`` gives each peer's (pid, pidfd), or None when some peer
    cannot be watched (then the wait polls every LIVENESS_S)."""

    def __init__(
        self,
        fd: int,
        set_sleeping: Callable[[int], None],
        peer_fds: Callable[[], Sequence[tuple[int, int]] | None],
    ) -> None:
        self.fd = fd
        self.set_sleeping = set_sleeping
        self.peer_fds = peer_fds
        self.policy = SpinPolicy(oversubscribed)
        self.one_cpu = False  # this process and its peers share one CPU: never spin
        self._asked = -AFFINITY_S  # when one_cpu was last asked
        self.sleeps = 0
        self.closed = False
        self._epoll: select.epoll | None = None  # made at the first park
        self._watched: Sequence[tuple[int, int]] = ()  # the (pid, pidfd)s in it

    async def wait(self, ready: Callable[[], bool], check_peer: Callable[[], None]) -> bool:
        """Return once ``ready()`` holds; ``check_peer`` raises when waiting longer
        is pointless (the peer died). Returns whether it parked (a parked wait
        went through trio's scheduler: a checkpoint, as far as trio knows)."""
        start = time.perf_counter()
        budget = 0.0 if self.one_cpu else self.policy.budget(start)
        outcome = spin(ready, start, budget) if budget else Spin.SKIPPED
        if outcome is Spin.READY:
            self.policy.record(outcome, budget, start, time.perf_counter())
            return False
        try:
            slept = await self._park(ready, check_peer)
        finally:
            self.policy.record(outcome, budget, start, time.perf_counter())
        self.sleeps += slept
        return slept

    async def _park(self, ready: Callable[[], bool], check_peer: Callable[[], None]) -> bool:
        epoll_fd = self._watch()
        if epoll_fd is None:
            check_peer()  # (a watched peer that is gone wakes the epoll set at once)
        set_sleeping = self.set_sleeping
        slept = False
        while True:
            set_sleeping(1)
            fence()  # order "sleeping = 1" before the re-check's loads
            if ready():
                set_sleeping(0)
                return slept
            slept = True
            try:
                if epoll_fd is not None:
                    await trio.lowlevel.wait_readable(epoll_fd)
                else:
                    with trio.move_on_after(LIVENESS_S):
                        await trio.lowlevel.wait_readable(self.fd)
            except trio.ClosedResourceError:
                pass  # closed by another task: said just below
            finally:
                if not self.closed:  # (a closed endpoint's header is unmapped)
                    set_sleeping(0)
            if self.closed:
                raise Closed("this ring endpoint was closed while a task waited on it")
            try:  # drain the doorbell (inline: this is the wake path)
                os.eventfd_read(self.fd)
            except BlockingIOError:
                pass
            if ready():
                return slept
            check_peer()
            epoll_fd = self._watch()

    def _watch(self) -> int | None:
        """The epoll set to park on, with the peers' pidfds in it; None if some
        peer cannot be watched. A pidfd its PeerWatch closes leaves the set by
        itself; a new peer (pid) gets its new pidfd registered."""
        watched = self.peer_fds()
        if watched is None:
            return None
        now = time.perf_counter()
        if watched != self._watched or now - self._asked > AFFINITY_S:
            self.one_cpu = one_cpu([pid for pid, _ in watched])
            self._asked = now
        epoll = self._epoll
        if epoll is None:
            try:
                epoll = self._epoll = select.epoll()
            except OSError:  # out of fds (EMFILE): poll this time, try again at the next
                return None
            epoll.register(self.fd, select.EPOLLIN)
        if watched != self._watched:
            for _, fd in watched:
                try:
                    epoll.register(fd, select.EPOLLIN)
                except FileExistsError:
                    pass
            self._watched = watched
        return epoll.fileno()

    def close(self) -> None:
        """Close the epoll set; a task parked on it gets Closed (trio needs to
        be told before an fd it waits on is closed, or that task would hang)."""
        self.closed = True
        if self._epoll is not None:
            with contextlib.suppress(RuntimeError):  # not in trio: nobody can be waiting
                trio.lowlevel.notify_closing(self._epoll.fileno())
            self._epoll.close()
            self._epoll = None

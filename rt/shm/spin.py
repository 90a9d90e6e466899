"""How long a waiting endpoint spins before it parks: a pure policy.

A wake from sleep costs ~100 µs on this VM, so on a quiet machine an
endpoint spins before it parks, long (``SPIN_HOT_S``) under continuous
traffic (the last wait ended within ``HOT_GAP_S``): otherwise one side
parks, its late reply makes the other park too, and every round trip pays
two wakes (151 µs against 18 µs, measured).

Spinning is a bet that the peer answers while we hold a core. Two things
make it a losing one, and the policy stops spinning for a while on either:

* *Contention.* With more runnable threads than cores, a spin holds a core
  that someone else (often the very peer it waits for) needs, and a process
  that spins looks like a busy loop to the kernel's scheduler: it loses the
  wake-up preemption that a process which sleeps gets, and waits whole time
  slices behind busy processes (a round trip's p99 went from 0.1 to 12 ms
  beside two busy loops, with spins of 250 µs). The evidence is a spin that
  was preempted (two looks at the ring ``PREEMPTED_S`` apart) while more
  threads are runnable than there are cores (``oversubscribed()``, asked
  only then: a preemption alone may be an interrupt, or the hypervisor
  taking the vCPU away, and there spinning is what keeps the vCPU awake).
  While the ``contended`` window is open, waits park at once: beside two
  busy processes that beat every spin length tried (round trip p50 and p99
  both), and parked endpoints hand each other the core the way ZMQ's
  sleeping threads do. When the window closes, ``oversubscribed()`` is asked
  again before spinning resumes, so a probe never spins into a busy machine.
* *No payoff.* ``MISSES_TO_BACK_OFF`` spins in a row that missed, each in a
  wait whose answer came more than twice the spin later but still within
  ``HOT_GAP_S`` (traffic is continuous, but the peer answers so much later
  than a spin lasts that a longer spin would not pay either), say spinning
  does not pay for this peer. While the ``parking`` window is open, waits
  park at once. A miss whose answer came within twice the spin proves
  nothing (a wake, or the peer, was a little slow), nor does one whose
  answer came after ``HOT_GAP_S`` (traffic had stopped), nor a short
  spin's (``SPIN_S``, after a quiet spell: it costs next to nothing).

Each window doubles with each new piece of evidence, from ``BACKOFF_MIN_S``
up to ``BACKOFF_MAX_S``, and halves for every ``DECAY_S`` without one. So a
machine that went quiet gets its spins back within ``BACKOFF_MAX_S``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

SPIN_S = 20e-6
SPIN_HOT_S = 250e-6
HOT_GAP_S = 1e-3
PREEMPTED_S = 50e-6  # one look at the ring takes < 1 µs: a gap this long is a deschedule
MISSES_TO_BACK_OFF = 3
BACKOFF_MIN_S = 2e-3
BACKOFF_MAX_S = 0.2
DECAY_S = 1.0


class Spin(enum.Enum):
    """How a wait's spin ended."""

    READY = "ready"  # the condition held while spinning: the spin paid off
    MISSED = "missed"  # spun the whole budget for nothing
    PREEMPTED = "preempted"  # descheduled while spinning
    SKIPPED = "skipped"  # no spin


class Window:
    """A back-off window: open until ``until``; its length doubles with each
    :meth:`extend` and halves for every DECAY_S since the previous one."""

    __slots__ = ("last", "length", "until")

    def __init__(self) -> None:
        self.length = 0.0
        self.last = 0.0  # when it was last extended
        self.until = 0.0

    def extend(self, now: float) -> None:
        spells = min(int((now - self.last) / DECAY_S), 64)
        self.length = min(max(2 * self.length / 2**spells, BACKOFF_MIN_S), BACKOFF_MAX_S)
        self.until = now + self.length
        self.last = now


class SpinPolicy:
    """The spin budget of one waiter, adapted to what its spins earned lately.
    ``oversubscribed()`` says whether more threads are runnable than there
    are cores, right now (asked after a preempted spin and before spinning
    again after contention)."""

    __slots__ = ("contended", "hot", "misses", "oversubscribed", "parking", "recheck")

    def __init__(self, oversubscribed: Callable[[], bool] = lambda: True) -> None:
        self.oversubscribed = oversubscribed
        self.hot = False  # traffic is continuous: a long spin may pay
        self.contended = Window()  # open: the cores are oversubscribed, no spins
        self.recheck = False  # ask oversubscribed() before the next spin
        self.parking = Window()  # open: spins have not been paying, no spins
        self.misses = 0  # long spins in a row that missed an answer that came soon after

    def budget(self, now: float) -> float:
        """Seconds to spin for a wait that starts at ``now``."""
        if now < self.parking.until or now < self.contended.until:
            return 0.0
        if self.recheck:
            if self.oversubscribed():
                self.contended.extend(now)
                return 0.0
            self.recheck = False
        return SPIN_HOT_S if self.hot else SPIN_S

    def record(self, outcome: Spin, budget: float, started: float, ended: float) -> None:
        """Learn from a wait that started at ``started`` with a spin of ``budget``
        seconds, and was over at ``ended``."""
        self.hot = ended - started < HOT_GAP_S
        if outcome is Spin.READY:
            self.misses = 0
        elif outcome is Spin.PREEMPTED and self.oversubscribed():
            self.contended.extend(ended)
            self.recheck = True
        elif outcome is Spin.MISSED and self._proves_no_payoff(budget, ended - started):
            self.misses += 1
            if self.misses >= MISSES_TO_BACK_OFF:
                self.misses = 0
                self.parking.extend(ended)

    def _proves_no_payoff(self, budget: float, waited: float) -> bool:
        """A long spin that missed an answer that came soon, but not just after it."""
        return self.hot and budget > SPIN_S and waited > 2 * budget


def spin(
    ready: Callable[[], bool],
    start: float,
    budget: float,
    clock: Callable[[], float] = time.perf_counter,
) -> Spin:
    """Look at ``ready()`` until it holds or ``budget`` seconds from ``start`` are spent."""
    deadline = start + budget
    last = start
    while True:
        if ready():
            return Spin.READY
        now = clock()
        if now - last > PREEMPTED_S:
            return Spin.PREEMPTED
        if now > deadline:
            return Spin.MISSED
        last = now

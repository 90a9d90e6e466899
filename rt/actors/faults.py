"""Fault-injection points: the per-process side of a :class:`FaultPlan`.

Actor code passes named points::

    if faults.check("step") is Verdict.DROP: ...        # sync
    verdict = await faults.point("receive")              # async (a delay sleeps in trio)

With no plan (or no rule for this actor) a point is one attribute test and
a return: ~50 ns sync, ~110 ns awaited (tools/bench_supervisor.py).
Crashes, hangs and delays happen inside the call; drop, duplicate and
corrupt are returned as a :class:`Verdict` for the caller to carry out.
"""

from __future__ import annotations

import enum
import os
import random
import signal
import sys
import time
from dataclasses import dataclass

import trio

from rt.actors.faultplan import FaultKind, FaultPlan, FaultRule
from rt.errors import FaultInjected


class Verdict(enum.Enum):
    PASS = "pass"
    DROP = "drop"
    DUPLICATE = "duplicate"
    CORRUPT = "corrupt"


_PASS = Verdict.PASS  # a module global: an enum member lookup costs ~80 ns on 3.11

_VERDICTS = {
    FaultKind.DROP: Verdict.DROP,
    FaultKind.DUPLICATE: Verdict.DUPLICATE,
    FaultKind.CORRUPT: Verdict.CORRUPT,
}


@dataclass(frozen=True)
class FiredFault:
    """One fault that fired: the ledger entry a chaos run records."""

    actor: str
    incarnation: int
    point: str
    hit: int  # the point's hit count when it fired (1-based)
    rule: int  # the rule's index in the plan
    action: FaultKind


class _Armed:
    __slots__ = ("fired", "hits", "index", "rng", "rule")

    def __init__(self, index: int, rule: FaultRule, rng: random.Random) -> None:
        self.index, self.rule, self.rng = index, rule, rng
        self.hits = self.fired = 0


class Faults:
    """The injector of one actor incarnation. ``Faults()`` injects nothing."""

    __slots__ = ("_points", "actor", "fired", "incarnation")

    def __init__(self, plan: FaultPlan | None = None, actor: str = "", incarnation: int = 1):
        self.actor, self.incarnation = actor, incarnation
        self.fired: list[FiredFault] = []
        self._points: dict[str, list[_Armed]] = {}
        for index, rule in plan.for_actor(actor, incarnation) if plan else ():
            # A string seed is hashed with SHA-512: stable across processes and runs.
            rng = random.Random(f"{plan.seed}/{actor}/{incarnation}/{index}")  # type: ignore[union-attr]
            self._points.setdefault(rule.point, []).append(_Armed(index, rule, rng))

    def __bool__(self) -> bool:
        return bool(self._points)

    def keyed(self, point: str) -> bool:
        """Whether a rule at ``point`` has a ``match``: a caller whose key costs
        something to build (say every request's token ids) builds it only then."""
        return any(armed.rule.match is not None for armed in self._points.get(point, ()))

    def check(self, point: str, key: str | None = None) -> Verdict:
        """Pass point ``point``. A delay blocks the thread (use :meth:`point` in trio code).
        ``key`` (say a request's text) is what a rule's ``match`` looks for."""
        if not self._points:  # no plan: the hot path
            return _PASS
        armed = self._armed(point, key)
        if armed is None:
            return _PASS
        if armed.rule.action is FaultKind.DELAY:
            time.sleep(armed.rule.delay_ms / 1000)
            return _PASS
        return self._act(armed)

    async def point(self, point: str, key: str | None = None) -> Verdict:
        """Pass point ``point`` from trio code: a delay is a trio sleep."""
        if not self._points:  # no plan: the hot path
            return _PASS
        armed = self._armed(point, key)
        if armed is None:
            return _PASS
        if armed.rule.action is FaultKind.DELAY:
            await trio.sleep(armed.rule.delay_ms / 1000)
            return _PASS
        return self._act(armed)

    def _armed(self, point: str, key: str | None) -> _Armed | None:
        """The rule that fires at this hit of ``point``, if any."""
        rules = self._points.get(point)
        return None if rules is None else self._fire(point, rules, key)

    def _fire(self, point: str, rules: list[_Armed], key: str | None) -> _Armed | None:
        hit = [
            armed
            for armed in rules
            if armed.rule.match is None or (key is not None and armed.rule.match in key)
        ]
        for armed in hit:  # every rule counts every hit of its point (that it matches)
            armed.hits += 1
        for armed in hit:  # the first rule that fires wins the hit
            rule = armed.rule
            if armed.hits <= rule.after or (rule.times and armed.fired >= rule.times):
                continue
            if rule.probability < 1.0 and armed.rng.random() >= rule.probability:
                continue
            armed.fired += 1
            self.fired.append(
                FiredFault(
                    self.actor, self.incarnation, point, armed.hits, armed.index, rule.action
                )
            )
            return armed
        return None

    def _act(self, armed: _Armed) -> Verdict:
        rule = armed.rule
        what = (
            f"fault plan rule {armed.index}: {rule.action.value} at point {rule.point!r} of "
            f"actor {self.actor!r} (incarnation {self.incarnation}, hit {armed.hits})"
        )
        # Written straight to stderr and flushed: the next line may end the process.
        sys.stderr.write(f"rt.actors.faults: {what}\n")
        sys.stderr.flush()
        action = rule.action
        if action in _VERDICTS:
            return _VERDICTS[action]
        if action is FaultKind.RAISE:
            raise FaultInjected(what)
        if action is FaultKind.OOM:
            raise MemoryError(what)
        if action is FaultKind.EXIT:
            os._exit(rule.exit_code)
        if action in (FaultKind.SIGKILL, FaultKind.SIGSEGV):
            os.kill(os.getpid(), signal.SIGKILL if action is FaultKind.SIGKILL else signal.SIGSEGV)
        if rule.hang == "gil":
            while True:  # spins on the trio thread: its heartbeat timer never runs again
                pass
        while True:  # hang = sleep, or a signal to self still in flight
            time.sleep(3600)


NO_FAULTS = Faults()

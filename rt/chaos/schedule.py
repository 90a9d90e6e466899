"""The seeded fault schedule: which actor, where or when, which fault.

A :class:`Schedule` is a list of :class:`Fault`, drawn from a seed by
:func:`draw_schedule` (the same seed and config draw the same list). A fault
reaches its actor one of two ways:

* ``via="plan"``: a rule of rt's own fault plan (:mod:`rt.actors.faultplan`),
  fired inside the actor at a frame boundary (point ``receive``: a frame
  arrived, before it is handled; ``send``: handled, before what it caused
  leaves and before the frame is committed), at a step (``step``,
  ``forward``, ``tokenize``) or at start-up (``startup``; incarnation 1 is the
  engine's start, a later one a restart). Counters restart with every
  incarnation, so the k-th crash planned for an actor is pinned to its k-th
  incarnation and the crashes come one after another.
* ``via="signal"``: the harness signals the actor's pid from outside
  (SIGKILL, SIGSEGV, SIGSTOP then SIGCONT or the watchdog) once the load is
  in the fault's ``phase``. Phase ``backlog`` makes one first: the actor
  that reads the target's output is stopped for a moment while tokens flow,
  so the target dies with frames it sent still unread (the scheduler's
  tokens on their way to a stopped detokenizer, a tokenizer's requests on
  their way to a stopped scheduler).

A poison fault (``match`` set) crashes its tokenizer whenever a request
whose text carries the marker is tokenized, or the scheduler whenever a
request whose prompt ids carry the marker (six ids, `` 5 17 9 … ``) is in
its core: the workload sends such requests, and rt must refuse each alone
while the others, batched with it, go on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

CRASHES = ("sigkill", "sigsegv", "exit", "raise", "oom")  # the actor dies
PLAN_KINDS = (*CRASHES, "hang", "delay", "drop", "duplicate", "corrupt")
SIGNAL_KINDS = ("sigkill", "sigsegv", "sigstop")
KINDS = (*PLAN_KINDS, "sigstop")
MAIN_KINDS = ("sigkill", "sigsegv", "exit", "raise", "hang", "sigstop", "delay", "oom")
PHASES = ("startup", "idle", "prefill", "decode", "stream", "backlog", "restart", "shutdown")
SIGNAL_PHASES = ("idle", "prefill", "decode", "stream", "backlog", "restart", "shutdown")

# The points each actor passes (rt/pipeline), and where each fault kind makes sense.
POINTS = {
    "tokenizer": ("startup", "receive", "send", "commit", "tokenize"),
    "scheduler": ("startup", "receive", "send", "commit", "step", "forward"),
    "detokenizer": ("startup", "receive", "send", "commit"),
}
VERDICT_POINTS = ("receive", "send")  # drop, duplicate and corrupt act on a frame
OOM_POINTS = ("step", "forward")


def role(actor: str) -> str:
    """``tokenizer0`` → ``tokenizer``."""
    return actor.rstrip("0123456789")


@dataclass(frozen=True)
class Fault:
    """One fault of a schedule. Plan faults use ``point``..``match``; signal
    faults use ``wait_s`` (after the previous signal fault) and ``stop_s``
    (SIGSTOP: SIGCONT after that long; None: left to the watchdog)."""

    id: int
    kind: str
    actor: str
    via: str  # "plan" | "signal"
    phase: str
    point: str | None = None
    after: int = 0
    times: int = 1
    probability: float = 1.0
    incarnation: int | None = None
    delay_ms: float = 0.0
    hang: str = "gil"
    match: str | None = None
    wait_s: float = 0.0
    stop_s: float | None = None

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind
        assert self.via in ("plan", "signal"), self.via
        assert self.via == "signal" or self.point is not None, "a plan fault needs a point"
        assert self.via == "plan" or self.kind in SIGNAL_KINDS, self.kind
        assert self.via == "signal" or self.kind in PLAN_KINDS, self.kind

    @property
    def crash(self) -> bool:
        """Whether the actor is expected to die of it (a hang dies by the watchdog)."""
        return (
            self.kind in CRASHES
            or self.kind == "hang"
            or (self.kind == "sigstop" and self.stop_s is None)
        )

    def rule(self) -> dict[str, Any]:
        """The rule of rt's fault plan (JSON form) for a plan fault."""
        assert self.via == "plan" and self.point is not None
        action = {"oom": "oom", "raise": "raise"}.get(self.kind, self.kind)
        rule: dict[str, Any] = {
            "actor": self.actor,
            "point": self.point,
            "action": action,
            "after": self.after,
            "times": self.times,
        }
        if self.incarnation is not None:
            rule["incarnation"] = self.incarnation
        if self.probability < 1.0:
            rule["probability"] = self.probability
        if self.kind == "delay":
            rule["delay_ms"] = self.delay_ms
        if self.kind == "hang":
            rule["hang"] = self.hang
        if self.match is not None:
            rule["match"] = self.match
        return rule

    def describe(self) -> str:
        if self.via == "signal":
            tail = ""
            if self.kind == "sigstop":
                tail = (
                    f", SIGCONT after {self.stop_s:.2f} s"
                    if self.stop_s
                    else ", until the watchdog"
                )
            elif self.phase == "backlog" and self.stop_s:
                tail = f", its reader stopped {self.stop_s:.3f} s before"
            return f"#{self.id} {self.kind} {self.actor} by signal, phase {self.phase}{tail}"
        what = self.kind + (f" {self.delay_ms:.0f} ms" if self.kind == "delay" else "")
        what += f" (p={self.probability:g})" if self.probability < 1.0 else ""
        what += f" ({self.hang})" if self.kind == "hang" else ""
        where = f"point {self.point}"
        if self.match:
            where += f" on requests carrying {self.match!r}"
        else:
            where += f" hit {self.after + 1}" + (" on, every time" if self.times == 0 else "")
        inc = f", incarnation {self.incarnation}" if self.incarnation else ""
        return f"#{self.id} {what} {self.actor} at {where}{inc}"


@dataclass(frozen=True)
class Schedule:
    seed: int
    faults: tuple[Fault, ...] = ()

    def plan(self) -> dict[str, Any] | None:
        """rt's fault plan for the plan faults (None when there are none)."""
        rules = [f.rule() for f in self.faults if f.via == "plan"]
        return {"seed": self.seed, "faults": rules} if rules else None

    def signals(self) -> list[Fault]:
        return [f for f in self.faults if f.via == "signal"]

    def poison_markers(self) -> list[str]:
        return [f.match for f in self.faults if f.match is not None]

    def subset(self, ids: Iterable[int]) -> Schedule:
        """The faults with these ids. Planned crashes are pinned to successive
        incarnations of their actor, so the kept ones are pinned again to
        1, 2, …: without that, dropping an actor's first crash would keep its
        later ones from ever firing (shrinking could not remove it)."""
        keep = set(ids)
        kept = [f for f in self.faults if f.id in keep]
        return replace(self, faults=tuple(_repin(f, kept) for f in kept))

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "faults": [asdict(f) for f in self.faults]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Schedule:
        names = {f.name for f in fields(Fault)}
        faults = tuple(Fault(**{k: v for k, v in f.items() if k in names}) for f in data["faults"])
        return cls(int(data["seed"]), faults)

    def dumps(self) -> str:
        return json.dumps(self.to_json())


@dataclass(frozen=True)
class ScheduleConfig:
    """What to draw: ``faults`` faults over ``actors`` with ``kinds`` at ``phases``;
    ``poison`` poison markers; ``frames`` the rough number of frames the
    scheduler and the detokenizer handle in the run (a tokenizer a quarter of
    that), which a planned hit is drawn within, split between incarnations."""

    actors: tuple[str, ...] = ("tokenizer0", "scheduler", "detokenizer")
    kinds: tuple[str, ...] = MAIN_KINDS
    phases: tuple[str, ...] = PHASES
    faults: int = 12
    poison: int = 0
    frames: int = 200
    watchdog_s: float = 4.0
    backlog_s: tuple[float, float] = (0.02, 0.3)  # a backlog fault's stop of the reader
    signal_share: float = 0.5  # of the kinds both ways can fire (sigkill, sigsegv)
    # a sweep: SIGKILL each actor in sweep_actors at each of the first ``sweep`` hits of
    # receive, of send and of commit, one incarnation after another (every frame boundary of a
    # request's life, when requests go one at a time)
    sweep: int = 0
    sweep_actors: tuple[str, ...] = ("tokenizer0", "scheduler", "detokenizer")
    # signal faults fire at least this long after the one before (0.3 to 2 s drawn; more
    # to fit an attached server's restart budget: rt.chaos.attach.spaced)
    min_wait_s: float = 0.3
    # a stop left to the watchdog: the next signal fault waits this much more (its
    # actor's restart comes a watchdog later; 0: not spread, as drawn)
    stop_restart_s: float = 0.0

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(KINDS)
        assert not unknown, f"unknown fault kinds {sorted(unknown)}; expected some of {KINDS}"
        unknown = set(self.phases) - set(PHASES)
        assert not unknown, f"unknown phases {sorted(unknown)}; expected some of {PHASES}"


def _repin(fault: Fault, kept: list[Fault]) -> Fault:
    if fault.via != "plan" or fault.incarnation is None:
        return fault
    earlier = sum(
        1
        for f in kept
        if f.via == "plan"
        and f.actor == fault.actor
        and f.crash
        and f.incarnation is not None
        and f.incarnation < fault.incarnation
    )
    return replace(fault, incarnation=earlier + 1)

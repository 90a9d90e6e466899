"""What a supervisor is asked to run: actor specs, ring declarations, policies.

Everything here is a frozen, picklable record checked in ``__post_init__``;
the supervisor builds its mutable state from these and never changes them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rt.errors import ConfigError


class Restart(enum.StrEnum):
    """When a child that exited is started again (Erlang/OTP's restart types)."""

    PERMANENT = "permanent"  # always
    TRANSIENT = "transient"  # only after an abnormal exit (non-zero, signal, watchdog)
    TEMPORARY = "temporary"  # never


class Strategy(enum.StrEnum):
    """Which children restart when one of them fails (Erlang/OTP's strategies)."""

    ONE_FOR_ONE = "one_for_one"  # only the failed child
    REST_FOR_ONE = "rest_for_one"  # the failed child and every child started after it
    ONE_FOR_ALL = "one_for_all"  # every child


def _is_tag(name: str) -> bool:
    """Usable in a segment name: letters, digits, '-', '_'."""
    return bool(name) and name.replace("-", "").replace("_", "").isalnum()


@dataclass(frozen=True)
class RingDecl:
    """A ring the supervisor creates at start and unlinks at shutdown."""

    name: str
    capacity: int = 1 << 20

    def __post_init__(self) -> None:
        if not _is_tag(self.name):
            raise ConfigError(f"ring name must be letters, digits, '-' or '_'; got {self.name!r}")


@dataclass(frozen=True)
class ActorSpec:
    """One child process. ``factory(*args, **kwargs)`` is called in the child and
    must return an :class:`~rt.actors.actor.Actor`; factory and arguments travel
    with cloudpickle, so a class importable in the parent is importable there.

    ``inboxes`` / ``outboxes`` name rings of the supervisor's ``rings``: the child
    attaches a receiver to each inbox and a sender to each outbox.
    ``watchdog_timeout`` (seconds without a heartbeat before SIGKILL) and
    ``shutdown_grace`` (seconds between SIGTERM and SIGKILL) default to the
    supervisor's when None. ``cpus``: the CPUs the child (each incarnation) is
    pinned to; None: wherever the parent may run.
    """

    name: str
    factory: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    restart: Restart = Restart.PERMANENT
    inboxes: tuple[str, ...] = ()
    outboxes: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    watchdog_timeout: float | None = None
    shutdown_grace: float | None = None
    startup_timeout: float = 60.0
    cpus: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.name or any(c.isspace() for c in self.name):
            raise ConfigError(f"actor name must be non-empty without spaces; got {self.name!r}")
        if not callable(self.factory):
            raise ConfigError(
                f"actor {self.name!r}: factory must be callable, got {self.factory!r}"
            )
        object.__setattr__(self, "restart", Restart(self.restart))
        for value, what in (
            (self.watchdog_timeout, "watchdog_timeout"),
            (self.shutdown_grace, "shutdown_grace"),
        ):
            if value is not None and value <= 0:
                raise ConfigError(f"actor {self.name!r}: {what} must be > 0 s, got {value}")
        if self.startup_timeout <= 0:
            raise ConfigError(f"actor {self.name!r}: startup_timeout must be > 0 s")
        if self.cpus is not None:
            object.__setattr__(self, "cpus", tuple(self.cpus))
            if not self.cpus or any(not isinstance(c, int) or c < 0 for c in self.cpus):
                raise ConfigError(
                    f"actor {self.name!r}: cpus must be CPU numbers >= 0, got {self.cpus!r}"
                )


@dataclass(frozen=True)
class SupervisorSpec:
    """A supervisor and its children, started in this order and stopped in reverse.
    A child may itself be a SupervisorSpec: a subtree, supervised as one child
    (it fails when it escalates) and run as trio tasks in this process.

    Intensity: more than ``max_restarts`` restarts within ``max_seconds`` escalate
    (everything stops, :class:`~rt.errors.EscalationError`). A child that crashes
    again within ``backoff_reset`` seconds of its start waits before its restart:
    0 the first time, then ``backoff_initial`` doubling up to ``backoff_max``.
    """

    children: tuple[ActorSpec | SupervisorSpec, ...]
    strategy: Strategy = Strategy.ONE_FOR_ONE
    rings: tuple[RingDecl, ...] = ()
    max_restarts: int = 5
    max_seconds: float = 60.0
    backoff_initial: float = 0.05
    backoff_max: float = 5.0
    backoff_reset: float = 10.0
    watchdog_timeout: float = 10.0
    shutdown_grace: float = 5.0
    name: str = "root"
    restart: Restart = Restart.PERMANENT  # when this supervisor is a child of another

    def __post_init__(self) -> None:
        object.__setattr__(self, "children", tuple(self.children))
        object.__setattr__(self, "rings", tuple(self.rings))
        object.__setattr__(self, "strategy", Strategy(self.strategy))
        object.__setattr__(self, "restart", Restart(self.restart))
        names = [c.name for c in self.children]
        if len(set(names)) != len(names):
            raise ConfigError(f"supervisor {self.name!r}: child names must be unique, got {names}")
        if self.max_restarts < 0 or self.max_seconds <= 0:
            raise ConfigError("max_restarts must be >= 0 and max_seconds > 0")
        if not 0 <= self.backoff_initial <= self.backoff_max:
            raise ConfigError("need 0 <= backoff_initial <= backoff_max")
        if self.watchdog_timeout <= 0 or self.shutdown_grace <= 0:
            raise ConfigError("watchdog_timeout and shutdown_grace must be > 0 s")
        if not _is_tag(self.name):  # it names the supervisor's heartbeat segment
            raise ConfigError(
                f"supervisor name must be letters, digits, '-' or '_'; got {self.name!r}"
            )

    def supervisors(self) -> Iterator[SupervisorSpec]:
        """This supervisor and every supervisor below it, depth first."""
        yield self
        for child in self.children:
            if isinstance(child, SupervisorSpec):
                yield from child.supervisors()

    def actors(self) -> Iterator[ActorSpec]:
        """Every actor of the tree."""
        for supervisor in self.supervisors():
            yield from (c for c in supervisor.children if isinstance(c, ActorSpec))

    def all_rings(self) -> tuple[RingDecl, ...]:
        """Every ring declared in the tree: the root supervisor creates them all,
        so a restarted subtree reattaches to the same rings."""
        return tuple(ring for supervisor in self.supervisors() for ring in supervisor.rings)

    def check_tree(self) -> None:
        """Checks that need the whole tree (the root supervisor runs them): names
        unique across the tree, every ring used declared, one producer and one
        consumer per ring."""
        names = [s.name for s in self.supervisors()] + [a.name for a in self.actors()]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"names must be unique across the supervision tree: {duplicates}")
        rings = [r.name for r in self.all_rings()]
        if len(set(rings)) != len(rings):
            raise ConfigError(f"ring names must be unique across the supervision tree: {rings}")
        declared = set(rings)
        consumers: dict[str, str] = {}
        producers: dict[str, str] = {}
        for actor in self.actors():
            for used, ends, side in (
                (actor.inboxes, consumers, "inbox"),
                (actor.outboxes, producers, "outbox"),
            ):
                for ring in used:
                    if ring not in declared:
                        raise ConfigError(
                            f"actor {actor.name!r}: {side} {ring!r} is not a declared ring; "
                            f"declared: {sorted(declared)}"
                        )
                    if ring in ends:
                        raise ConfigError(
                            f"ring {ring!r} is single-producer single-consumer, but both "
                            f"{ends[ring]!r} and {actor.name!r} use it as {side}"
                        )
                    ends[ring] = actor.name

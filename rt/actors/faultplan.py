"""Fault plans: which injection point, in which actor, does what, and when.

A plan is a seed plus rules, loaded from TOML or JSON (a file, or the
``RT_FAULT_PLAN`` environment variable holding JSON or a path)::

    seed = 7
    [[faults]]
    actor = "tok*"          # fnmatch pattern on the actor name (default "*")
    point = "receive"       # receive, send, commit, loop, startup, or an actor's own
    action = "sigkill"      # see FaultKind
    after = 3               # let 3 hits pass first (default 0)
    times = 1               # fire at most once per incarnation (0: no limit)
    probability = 1.0       # seeded: the same seed fires the same faults
    incarnation = 1         # only in the first start (or max_incarnation = K)
    match = "POISON"        # only at hits whose key contains it: at a tokenizer's
                            # "tokenize", the request's text; at the scheduler's
                            # "forward", each request's prompt ids as " 5 17 9 "

Hit counters and the random stream restart with every incarnation (a
restarted child is a new process), so "crash once, then recover" is
``incarnation = 1``.

A plan is checked before anything starts: each field's type, ``delay_ms`` at
most MAX_DELAY_MS (a longer one is a hang the watchdog never sees: use
``action = "hang"``), incarnations counted from 1, and (``check_points``) a rule
that matches no actor, or none that passes its point, is refused.
"""

from __future__ import annotations

import enum
import json
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from rt.errors import ConfigError

ENV_VAR = "RT_FAULT_PLAN"
BUILTIN_POINTS = frozenset({"startup", "receive", "send", "commit", "loop"})
MAX_DELAY_MS = 60_000.0  # a longer delay is a hang the watchdog never sees (trio sleeps on)


class FaultKind(enum.StrEnum):
    RAISE = "raise"  # raise FaultInjected
    EXIT = "exit"  # os._exit(exit_code)
    SIGKILL = "sigkill"  # SIGKILL itself
    SIGSEGV = "sigsegv"  # SIGSEGV itself
    HANG = "hang"  # block the thread: hang = "gil" (busy loop) or "sleep"
    DELAY = "delay"  # wait delay_ms, then go on
    DROP = "drop"  # the caller drops the frame
    DUPLICATE = "duplicate"  # the caller handles the frame twice
    CORRUPT = "corrupt"  # the caller corrupts the frame
    OOM = "oom"  # raise MemoryError


@dataclass(frozen=True)
class FaultRule:
    point: str
    action: FaultKind
    actor: str = "*"
    after: int = 0
    times: int = 1
    probability: float = 1.0
    incarnation: int | None = None
    max_incarnation: int | None = None
    exit_code: int = 1
    delay_ms: float = 0.0
    hang: str = "gil"
    match: str | None = None

    def __post_init__(self) -> None:
        _check_types(self)
        try:
            object.__setattr__(self, "action", FaultKind(self.action))
        except ValueError:
            raise ConfigError(
                f"fault action {self.action!r} is unknown; expected one of "
                f"{[k.value for k in FaultKind]}"
            ) from None
        if not self.point:
            raise ConfigError("a fault rule needs a point (receive, send, loop, startup, ...)")
        if self.after < 0 or self.times < 0:
            raise ConfigError(f"fault at {self.point!r}: after and times must be >= 0")
        if not 0.0 <= self.probability <= 1.0:
            raise ConfigError(f"fault at {self.point!r}: probability must be in [0, 1]")
        if self.hang not in ("gil", "sleep"):
            raise ConfigError(f"fault at {self.point!r}: hang must be 'gil' or 'sleep'")
        if not 0 <= self.exit_code <= 255:  # (256 exits 0: no failure at all)
            raise ConfigError(
                f"fault at {self.point!r}: exit_code must be in [0, 255], got {self.exit_code}"
            )
        if not 0 <= self.delay_ms <= MAX_DELAY_MS:  # (NaN too)
            raise ConfigError(
                f"fault at {self.point!r}: delay_ms must be in [0, {MAX_DELAY_MS:g}] "
                f"(longer is a hang: action 'hang'), got {self.delay_ms!r}"
            )
        for name in ("incarnation", "max_incarnation"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(
                    f"fault at {self.point!r}: {name} counts from 1, got {getattr(self, name)}"
                )

    def applies_to(self, actor: str, incarnation: int) -> bool:
        if not fnmatchcase(actor, self.actor):
            return False
        if self.incarnation is not None and incarnation != self.incarnation:
            return False
        return self.max_incarnation is None or incarnation <= self.max_incarnation


_RULE_FIELDS = {f.name for f in fields(FaultRule)}
_INTS = ("after", "times", "incarnation", "max_incarnation", "exit_code")
_STRS = ("point", "action", "actor", "hang", "match")


def _whole(value: Any) -> int | None:
    """``value`` as an integer: an int, a float with no fraction (TOML's ``3.0``,
    taken before), or a string of digits (a seed's, taken before); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()):
        return int(value)
    return None


def _check_types(rule: FaultRule) -> None:
    """Each field of the type it needs (a plan is the user's JSON or TOML: a list for
    a point, or 1e400 for times, raised a TypeError, or was taken as infinity)."""
    for name in _INTS:
        value = getattr(rule, name)
        whole = None if isinstance(value, str) else _whole(value)
        if value is not None and whole is None:
            raise ConfigError(f"fault rule: {name} must be an integer, got {value!r}")
        object.__setattr__(rule, name, whole)
    for name in _STRS:
        value = getattr(rule, name)
        if not isinstance(value, str) and not (value is None and name == "match"):
            raise ConfigError(f"fault rule: {name} must be a string, got {value!r}")
    for name in ("probability", "delay_ms"):
        value = getattr(rule, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"fault rule: {name} must be a number, got {value!r}")


@dataclass(frozen=True)
class FaultPlan:
    rules: tuple[FaultRule, ...] = ()
    seed: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultPlan:
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"fault plan: expected an object with seed and faults, got {type(data).__name__}"
            )
        unknown = set(data) - {"seed", "faults"}
        if unknown:
            raise ConfigError(f"fault plan: unknown keys {sorted(unknown)}; expected seed, faults")
        seed, faults = _whole(data.get("seed", 0)), data.get("faults", ())
        if seed is None:
            raise ConfigError(f"fault plan: seed must be an integer, got {data['seed']!r}")
        if not isinstance(faults, list | tuple):
            raise ConfigError(f"fault plan: faults must be a list of rules, got {faults!r}")
        rules = []
        for i, raw in enumerate(faults):
            if not isinstance(raw, Mapping):
                raise ConfigError(f"fault plan rule {i}: expected an object, got {raw!r}")
            extra = set(raw) - _RULE_FIELDS
            if extra:
                raise ConfigError(
                    f"fault plan rule {i}: unknown keys {sorted(extra)}; expected {sorted(_RULE_FIELDS)}"
                )
            try:
                rules.append(FaultRule(**raw))
            except TypeError as err:
                raise ConfigError(f"fault plan rule {i}: {err}") from err
            except ConfigError as err:
                raise ConfigError(f"fault plan rule {i}: {err}") from None
        return cls(tuple(rules), seed)

    @classmethod
    def parse(cls, text: str, fmt: str = "json") -> FaultPlan:
        try:
            data = tomllib.loads(text) if fmt == "toml" else json.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as err:
            raise ConfigError(f"fault plan is not valid {fmt}: {err}") from err
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> FaultPlan:
        """Read a ``.toml`` or ``.json`` file."""
        path = Path(path)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"fault plan {str(path)!r}: cannot read it ({err})") from err
        return cls.parse(text, "toml" if path.suffix == ".toml" else "json")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> FaultPlan | None:
        """The plan in ``RT_FAULT_PLAN`` (JSON text, or a path), or None."""
        value = environ.get(ENV_VAR, "").strip()
        if not value:
            return None
        return cls.parse(value) if value.startswith("{") else cls.load(value)

    def for_actor(self, actor: str, incarnation: int) -> list[tuple[int, FaultRule]]:
        """The rules (with their index in the plan) that apply to one incarnation."""
        return [(i, r) for i, r in enumerate(self.rules) if r.applies_to(actor, incarnation)]

    def check_actors(self, actors: Iterable[Any]) -> None:
        """:meth:`check_points` for actor specs: each passes the built-in points
        and its factory's ``fault_points``."""
        own: dict[str, frozenset[str]] = {
            a.name: getattr(a.factory, "fault_points", frozenset()) for a in actors
        }
        self.check_points({name: BUILTIN_POINTS | points for name, points in own.items()})

    def check_points(self, actors: Mapping[str, frozenset[str]]) -> None:
        """Raise ConfigError for a rule that matches no actor, or whose point none of
        the actors it matches passes (a typo would otherwise make a chaos test
        silently fault-free).
        ``actors`` maps each actor's name to its injection points."""
        for i, rule in enumerate(self.rules):
            matched = [name for name in actors if fnmatchcase(name, rule.actor)]
            if not matched:
                raise ConfigError(
                    f"fault plan rule {i}: no actor matches {rule.actor!r}; the actors: "
                    f"{sorted(actors)}"
                )
            if not any(rule.point in actors[name] for name in matched):
                points = sorted(set().union(*(actors[name] for name in matched)))
                raise ConfigError(
                    f"fault plan rule {i}: no actor matching {rule.actor!r} ({matched}) "
                    f"passes point {rule.point!r}; their points: {points}"
                )

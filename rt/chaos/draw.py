"""Drawing a schedule from a seed (pure: the same seed and config, the same faults).

Coverage before chance: kinds and actors are dealt from shuffled decks, so a
schedule of at least ``len(kinds)`` faults has every kind and one of at least
three faults every actor; where, when and how much are drawn.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from typing import TypeVar

from rt.chaos.schedule import (
    CRASHES,
    OOM_POINTS,
    POINTS,
    SIGNAL_PHASES,
    VERDICT_POINTS,
    Fault,
    Schedule,
    ScheduleConfig,
    role,
)

T = TypeVar("T")
POISON_KINDS = ("exit", "sigsegv", "sigkill", "raise")


def deck(rng: random.Random, items: tuple[T, ...]) -> Iterator[T]:
    """Endless: each round a fresh shuffle of ``items``."""
    while True:
        cards = list(items)
        rng.shuffle(cards)
        yield from cards


def draw_schedule(seed: int, config: ScheduleConfig) -> Schedule:
    rng = random.Random(f"{seed}/schedule")
    kinds, actors = deck(rng, config.kinds), deck(rng, config.actors)
    signal_phases = [p for p in config.phases if p in SIGNAL_PHASES]
    crashes: Counter[str] = Counter()  # plan crashes per actor so far: the next one's incarnation
    faults: list[Fault] = []
    shutdown_drawn = False
    after_stop = 0.0  # the next signal fault's wait past a stop left to the watchdog
    for i in range(config.faults):
        kind, actor = next(kinds), next(actors)
        if kind == "oom":
            actor = "scheduler"  # an out-of-memory error in the scheduler's step
        signal = kind == "sigstop" or (
            kind in ("sigkill", "sigsegv") and rng.random() < config.signal_share
        )
        if signal and signal_phases:
            # a restart phase waits for an actor to be down: only an earlier fault can take
            # one down (signal faults fire in order), or it never fires and holds back every
            # later one (an attached run of 10 faults fired none, and passed)
            down = any(f.via == "plan" or f.kind in ("sigkill", "sigsegv") for f in faults)
            phases = [
                p
                for p in signal_phases
                if (p != "shutdown" or not shutdown_drawn) and (p != "restart" or down)
            ] or [p for p in signal_phases if p != "shutdown" or not shutdown_drawn]
            phase = rng.choice(phases)
            shutdown_drawn |= phase == "shutdown"
            stop_s = None
            if kind == "sigstop" and rng.random() < 0.5:
                stop_s = round(rng.uniform(0.2, 0.5 * config.watchdog_s), 2)
            elif phase == "backlog" and kind != "sigstop":  # its reader's stop before it
                stop_s = round(rng.uniform(*config.backlog_s), 3)
            wait_s = rng.uniform(0.3, 2.0) + max(0.0, config.min_wait_s - 0.3) + after_stop
            wait_s = round(wait_s, 2)
            after_stop = config.stop_restart_s if kind == "sigstop" and stop_s is None else 0.0
            faults.append(Fault(i, kind, actor, "signal", phase, wait_s=wait_s, stop_s=stop_s))
            continue
        if kind == "sigstop":
            kind = "hang"  # no signal phase allowed: the same fault from inside
        faults.append(_plan_fault(rng, i, kind, actor, config, crashes))
    for k in range(config.poison):
        faults.append(_poison(rng, config.faults + k, k, config))
    faults += _sweep(len(faults), config, crashes)
    return Schedule(seed, tuple(faults))


def _poison(rng: random.Random, i: int, k: int, config: ScheduleConfig) -> Fault:
    """The k-th poison fault: every other one (when the scheduler is in the run)
    kills the scheduler whenever a request whose prompt ids carry its marker is
    in the core, the others a tokenizer whenever it tokenizes a text carrying
    its marker."""
    kind = rng.choice(POISON_KINDS)
    if _scheduler_poison(k, config):
        marker = id_marker(rng)
        return Fault(i, kind, "scheduler", "plan", "frame", point="forward", times=0, match=marker)
    return Fault(
        i, kind, "tokenizer*", "plan", "frame", point="tokenize", times=0, match=f"POISON-{k}"
    )


def _scheduler_poison(k: int, config: ScheduleConfig) -> bool:
    """Whether the k-th poison is the scheduler's: every other one, when it is in the run."""
    return k % 2 == 1 and any(role(a) == "scheduler" for a in config.actors)


def id_marker(rng: random.Random) -> str:
    """Six token ids as the scheduler's fault key writes them (`` 5 17 9 … ``),
    small enough for any vocabulary."""
    return " " + " ".join(str(rng.randrange(3, 64)) for _ in range(6)) + " "


def _sweep(first_id: int, config: ScheduleConfig, crashes: Counter[str]) -> list[Fault]:
    """Kills at hits 1..sweep of receive, then of send, then of commit, each in an incarnation of
    its own (after those the random faults already planned); and half the
    tokenizer's sends late, so that a request's first tokens often reach the
    detokenizer before the frontend has opened its stream (a window to die in)."""
    if not config.sweep:
        return []
    out: list[Fault] = [
        Fault(
            first_id,
            "delay",
            "tokenizer*",
            "plan",
            "frame",
            point="send",
            times=0,
            probability=0.5,
            delay_ms=300.0,
        )
    ]
    for actor in config.sweep_actors:
        for point in ("receive", "send", "commit"):
            for hit in range(config.sweep):
                crashes[actor] += 1
                out.append(
                    Fault(
                        first_id + len(out),
                        "sigkill",
                        actor,
                        "plan",
                        "frame",
                        point=point,
                        after=hit,
                        incarnation=crashes[actor],
                    )
                )
    return out


def _hits_per_incarnation(actor: str, config: ScheduleConfig) -> int:
    """Where a planned hit may land: within the frames one incarnation of the
    actor is likely to see. A run's frames are shared by every incarnation
    (each crash of the actor, planned, signalled or by a poison request,
    starts a new one with its counters at 0); a hit drawn past them never
    fires. A tokenizer sees a frame per request, a quarter of the others'."""
    frames = config.frames if role(actor) != "tokenizer" else config.frames // 4
    deaths = config.faults / max(len(config.actors), 1)
    scheduler_poison = sum(_scheduler_poison(k, config) for k in range(config.poison))
    if role(actor) == "tokenizer":  # each poison request kills its actor a few times
        deaths += 3 * (config.poison - scheduler_poison)
    elif role(actor) == "scheduler":
        deaths += 3 * scheduler_poison
    return max(2, int(frames / (deaths + 1)))


def _plan_fault(
    rng: random.Random,
    i: int,
    kind: str,
    actor: str,
    config: ScheduleConfig,
    crashes: Counter[str],
) -> Fault:
    points = list(POINTS[role(actor)])
    if kind in ("drop", "duplicate", "corrupt"):
        points = [p for p in points if p in VERDICT_POINTS]
    elif kind == "oom":
        points = list(OOM_POINTS)
    elif kind == "raise":
        # an exception at "tokenize" is one request's (the tokenizer refuses it, as it
        # should): a refused innocent, not an actor fault
        points = [p for p in points if p != "tokenize"]
    crash = kind in CRASHES or kind == "hang"
    first = crashes[actor] == 0
    startup_ok = (
        crash
        and kind != "hang"
        and (("startup" in config.phases and first) or ("restart" in config.phases and not first))
    )
    if not startup_ok or rng.random() < 0.6:  # most faults at frames and steps
        points = [p for p in points if p != "startup"]
    point = rng.choice(points)
    if crash:
        crashes[actor] += 1
        incarnation = crashes[actor]
    else:
        incarnation = rng.randint(1, crashes[actor] + 1)
    if point == "startup":
        phase, after = ("startup" if incarnation == 1 else "restart"), 0
    else:
        phase = "step" if point in ("step", "forward") else "frame"
        after = rng.randrange(_hits_per_incarnation(actor, config))
    times, delay_ms = 1, 0.0
    if kind == "delay":  # a few long stalls, or a slow actor: every frame a little late
        slow = rng.random() < 0.3
        times = 0 if slow else rng.randint(1, 5)
        delay_ms = round(rng.uniform(5, 120) if slow else rng.uniform(50, 800))
        after = 0 if slow and point != "startup" else after  # slow from its start
    return Fault(
        i,
        kind,
        actor,
        "plan",
        phase,
        point=point,
        after=after,
        times=times,
        incarnation=incarnation,
        delay_ms=delay_ms,
        hang=rng.choice(("gil", "sleep")) if kind == "hang" else "gil",
    )

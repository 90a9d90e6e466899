"""CPU lists and pinning: which CPUs a process (and every thread it has) may run on.

On a host the engine has to itself, pinning the scheduler to CPUs of its own and
everything else (tokenizers, detokenizer, the HTTP front, a client on the same
host) to the rest keeps the short work of those from preempting a step. On the
2-core machine of docs/benchmarks.md it made rt-serve's decode at concurrency 1
steadier (ITL p50 -9 %, p99 -25 %, output +8 %) and changed nothing measurable
at 16. On a shared host it is hostile (a pinned process cannot move away from a
busy core), so it is off unless asked for.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from rt.errors import ConfigError


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``"0-2,5"`` → ``(0, 1, 2, 5)``: the format of ``taskset -c`` and of
    /proc/*/status's ``Cpus_allowed_list``."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            lo = int(first)
            hi = int(last) if dash else lo
        except ValueError:
            raise ConfigError(
                f"a CPU list is numbers and ranges like '0-2,5'; got {text!r}"
            ) from None
        if lo < 0 or hi < lo:
            raise ConfigError(f"a CPU range is 'low-high' with 0 <= low <= high; got {part!r}")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """``(0, 1, 2, 5)`` → ``"0-2,5"``."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def split_cpus(scheduler_cpus: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the scheduler's CPUs, everyone else's): the CPUs named, and the rest of
    those this process may run on. Each named CPU must be one of those, and at
    least one must be left for the others."""
    allowed = set(os.sched_getaffinity(0))
    mine = parse_cpu_list(scheduler_cpus)
    outside = sorted(set(mine) - allowed)
    if outside:
        raise ConfigError(
            f"scheduler_cpus: CPU {format_cpu_list(outside)} is not one this process may run "
            f"on ({format_cpu_list(allowed)})"
        )
    rest = tuple(sorted(allowed - set(mine)))
    if not rest:
        raise ConfigError(
            f"scheduler_cpus: {scheduler_cpus!r} takes every CPU this process may run on "
            f"({format_cpu_list(allowed)}); leave at least one for the tokenizers, the "
            "detokenizer and the front"
        )
    return mine, rest


def pin_process(cpus: Iterable[int], pid: int | None = None) -> None:
    """Pin every thread of a process (this one by default) to ``cpus``; threads it
    starts later inherit the mask of the thread that starts them."""
    mask = set(cpus)
    for tid in os.listdir(f"/proc/{pid or 'self'}/task"):
        try:
            os.sched_setaffinity(int(tid), mask)
        except ProcessLookupError:  # a thread that ended since the listing
            pass

"""Shrinking a failing fault schedule: delta debugging (Zeller's ddmin).

``await ddmin(items, fails)`` returns a subset of ``items`` for which
``fails`` still holds and from which no single chunk at the finest
granularity tried can be removed (1-minimal when the budget allows). Each
call of ``fails`` replays a run, which costs seconds to minutes, so the
number of calls is bounded (``budget``) and no subset is tried twice. A
failure that does not come back on replay (timing) simply keeps the larger
schedule: the result always failed at least once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class Shrunk(Generic[T]):
    items: list[T]
    tries: int = 0
    exhausted: bool = False  # the budget ran out before the result was 1-minimal
    log: list[tuple[int, bool]] = field(default_factory=list)  # (size tried, failed)


async def ddmin(
    items: Sequence[T],
    fails: Callable[[list[T]], Awaitable[bool]],
    budget: int = 30,
) -> Shrunk[T]:
    current = list(items)
    result: Shrunk[T] = Shrunk(current)
    tried: dict[tuple[int, ...], bool] = {}
    index = {id(item): i for i, item in enumerate(items)}

    async def test(subset: list[T]) -> bool | None:
        key = tuple(sorted(index[id(x)] for x in subset))
        if key in tried:
            return tried[key]
        if result.tries >= budget:
            result.exhausted = True
            return None
        result.tries += 1
        failed = await fails(subset)
        tried[key] = failed
        result.log.append((len(subset), failed))
        return failed

    if await test([]):  # fails with no fault at all
        result.items = []
        return result
    n = 2
    while len(current) >= 2:
        chunks = _split(current, n)
        reduced = False
        for chunk in chunks:  # a chunk alone
            verdict = await test(chunk)
            if verdict is None:
                return _done(result, current)
            if verdict:
                current, n, reduced = chunk, 2, True
                break
        if not reduced and n > 2:
            for i in range(len(chunks)):  # everything but one chunk
                rest = [x for j, c in enumerate(chunks) if j != i for x in c]
                verdict = await test(rest)
                if verdict is None:
                    return _done(result, current)
                if verdict:
                    current, n, reduced = rest, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(current):
                break
            n = min(2 * n, len(current))
    return _done(result, current)


def _done(result: Shrunk[T], current: list[T]) -> Shrunk[T]:
    result.items = current
    return result


def _split(items: list[T], n: int) -> list[list[T]]:
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        if end > start:
            out.append(items[start:end])
        start = end
    return out

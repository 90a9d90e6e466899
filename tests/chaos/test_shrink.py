"""Delta debugging finds the smallest failing subset, within its budget, never twice the same."""

from __future__ import annotations

from rt.chaos.shrink import ddmin


async def test_ddmin_finds_the_pair_that_fails_together() -> None:
    calls: list[list[int]] = []

    async def fails(items: list[int]) -> bool:
        calls.append(items)
        return 3 in items and 11 in items

    shrunk = await ddmin(list(range(16)), fails, budget=100)
    assert sorted(shrunk.items) == [3, 11]
    assert not shrunk.exhausted
    assert len({tuple(sorted(c)) for c in calls}) == len(calls)  # no subset tried twice


async def test_a_failure_without_faults_shrinks_to_nothing() -> None:
    async def fails(items: list[int]) -> bool:
        return True

    shrunk = await ddmin(list(range(8)), fails)
    assert shrunk.items == [] and shrunk.tries == 1


async def test_the_budget_bounds_the_replays() -> None:
    async def fails(items: list[int]) -> bool:
        return 5 in items

    shrunk = await ddmin(list(range(64)), fails, budget=4)
    assert shrunk.tries == 4 and shrunk.exhausted
    assert 5 in shrunk.items  # what it returns always failed


async def test_a_failure_that_does_not_come_back_keeps_the_whole_schedule() -> None:
    async def fails(items: list[int]) -> bool:
        return False  # a timing failure that replays never show again

    shrunk = await ddmin(list(range(6)), fails, budget=50)
    assert shrunk.items == list(range(6))

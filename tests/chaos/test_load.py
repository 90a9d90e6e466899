"""The load generator sends a count of requests, or goes on past it until the
injector is done (``until``), never more than ``MOST`` times the count."""

from __future__ import annotations

import trio

from rt.chaos.load import MOST, Load
from rt.chaos.workload import RequestSpec, WorkloadConfig, draw_request


def draw(index: int) -> RequestSpec:
    return draw_request(1, index, WorkloadConfig())


class Recorder:
    """A request that takes a little while; the indexes sent, in order."""

    def __init__(self, on_start: trio.Event | None = None, at: int = 0) -> None:
        self.indexes: list[int] = []
        self.on_start, self.at = on_start, at

    async def __call__(self, spec: RequestSpec) -> None:
        self.indexes.append(spec.index)
        if self.on_start is not None and len(self.indexes) == self.at:
            self.on_start.set()
        await trio.sleep(0.01)


async def test_a_count_sends_that_many_once_each() -> None:
    sent = Recorder()
    load = Load(draw, sent, concurrency=3, requests=7)
    await load()
    assert sent.indexes == list(range(7)) and load.finished.is_set()


async def test_until_goes_on_past_the_count_until_it_is_set() -> None:
    done = trio.Event()
    sent = Recorder(done, at=12)
    await Load(draw, sent, concurrency=3, requests=5, until=done)()
    # the 12th started sets it: at most the requests already waiting on a slot follow
    assert 12 <= len(sent.indexes) <= 12 + 3
    assert sent.indexes == list(range(len(sent.indexes)))


async def test_until_never_set_stops_at_most_times_the_count() -> None:
    sent = Recorder()
    await Load(draw, sent, concurrency=4, requests=5, until=trio.Event())()
    assert len(sent.indexes) == MOST * 5


async def test_until_already_set_is_the_count() -> None:
    done = trio.Event()
    done.set()
    sent = Recorder()
    await Load(draw, sent, concurrency=2, requests=4, until=done)()
    assert len(sent.indexes) == 4

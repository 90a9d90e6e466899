"""The frontend's ends of its rings, on real rings: what they cost the other
tasks of the frontend's trio loop.

Under load every checkpoint on a request's path waits for a whole round of
the loop's other runnable tasks (rt-serve's connections among them), so the
frontend hands over frames already waiting, and sends what was queued, in one
turn. These tests count turns with a task that records, each time it runs,
what the frontend's end has done so far.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import aclosing

import pytest
import trio
import trio.testing

from rt.errors import WouldBlock
from rt.frontend.plumbing import FRAME_BURST, Controls, Out, frames
from rt.shm import Ring, RingReceiver, RingSender, codec, new_run_prefix

CAP = 1 << 16


@pytest.fixture
def ends() -> Iterator[tuple[Out, RingReceiver]]:
    with Ring.create(new_run_prefix(), "plumb", capacity=CAP) as ring:
        out, rx = Out(RingSender.attach(ring.spec)), RingReceiver.attach(ring.spec)
        yield out, rx
        out.tx.close()
        rx.close()


class Turns:
    """A task that runs once per round of the loop and records ``seen()`` each time."""

    def __init__(self, seen: Callable[[], int]) -> None:
        self.seen = seen
        self.log: list[int] = []

    async def run(self) -> None:
        while True:
            self.log.append(self.seen())
            await trio.lowlevel.checkpoint()

    def rounds_until(self, count: int) -> int:
        """Turns this task had after something was seen and before ``count`` were."""
        return sum(1 for seen in self.log if 0 < seen < count)


async def until(done: Callable[[], bool]) -> None:
    """Let the loop run (the Turns task never blocks) until ``done()``."""
    with trio.fail_after(10):
        while not done():
            await trio.lowlevel.checkpoint()


def sent(out: Out) -> Callable[[], int]:
    return lambda: out.tx.statistics().frames_sent


def drain(rx: RingReceiver) -> list[object]:
    got = []
    while rx.has_frame():
        got.append(codec.loads(rx.receive_data_nowait()))
    rx.commit()
    return got


async def hand_over(out: Out, rx: RingReceiver, total: int) -> Turns:
    """Put ``total`` frames in the ring, read them through ``frames`` beside a
    Turns task counting those read; the Turns it was."""
    for i in range(total):
        out.tx.send_nowait(codec.dumps(i))
    got: list[int] = []
    turns = Turns(lambda: len(got))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(turns.run)
        await until(lambda: bool(turns.log))
        async with aclosing(frames(rx)) as messages:
            async for msg in messages:
                got.append(msg)
                if len(got) == total:
                    break
        nursery.cancel_scope.cancel()
    assert got == list(range(total))
    return turns


async def test_frames_waiting_in_the_ring_are_handed_over_in_one_turn(ends) -> None:
    turns = await hand_over(*ends, FRAME_BURST)
    assert turns.rounds_until(FRAME_BURST) == 0, turns.log


async def test_a_long_burst_still_lets_the_other_tasks_run(ends) -> None:
    total = 5 * FRAME_BURST
    turns = await hand_over(*ends, total)
    # the other task ran at least once in every two bursts (its place in a round is random)
    seen = [*turns.log, total]
    assert max(b - a for a, b in itertools.pairwise(seen)) <= 2 * FRAME_BURST, turns.log


async def test_a_handled_frame_is_committed_before_the_next_is_handed_over(ends) -> None:
    out, rx = ends
    for i in range(3):
        out.tx.send_nowait(codec.dumps(i))
    committed = []
    async with aclosing(frames(rx)) as messages:
        async for _ in messages:
            committed.append(rx.statistics().frames_committed)
            if len(committed) == 3:
                break
    assert committed == [0, 1, 2]  # each while its own frame is handled: not yet


async def test_queued_messages_are_sent_in_one_turn_and_in_order(ends) -> None:
    out, rx = ends
    controls = Controls()
    turns = Turns(sent(out))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(turns.run)
        nursery.start_soon(controls.run)
        await until(lambda: bool(turns.log))
        for i in range(50):
            controls.queue(out, i)
        await until(lambda: sent(out)() == 50)
        nursery.cancel_scope.cancel()
    assert drain(rx) == list(range(50))
    assert turns.rounds_until(50) == 0, turns.log


async def test_a_full_ring_holds_up_only_its_own_queued_messages(ends) -> None:
    """A detokenizer slow to take 100k stream opens must not hold up an abort
    queued after them for the scheduler's ring."""
    slow, _ = ends  # its reader never reads
    with Ring.create(new_run_prefix(), "other", capacity=CAP) as ring:
        fast, rx = Out(RingSender.attach(ring.spec)), RingReceiver.attach(ring.spec)
        controls = Controls()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(controls.run)
            for i in range(CAP):  # far past what its ring holds
                controls.queue(slow, i)
            controls.queue(fast, "abort")
            controls.queue(fast, "close")
            await until(lambda: sent(fast)() == 2)
            assert sent(slow)() < CAP  # still waiting for room
            nursery.cancel_scope.cancel()
        assert drain(rx) == ["abort", "close"]
        fast.tx.close()
        rx.close()


async def test_callers_sending_at_once_into_a_ring_with_room_do_not_queue(ends) -> None:
    """Before, each send held the ring's lock across its checkpoint: 50 callers
    took 50 rounds of the loop, one after the other."""
    out, rx = ends
    turns = Turns(sent(out))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(turns.run)
        await until(lambda: bool(turns.log))
        for i in range(50):
            nursery.start_soon(out.send, i)
        await until(lambda: sent(out)() == 50)
        nursery.cancel_scope.cancel()
    assert sorted(drain(rx)) == list(range(50))
    assert turns.rounds_until(50) <= 1, turns.log


async def test_a_caller_waiting_for_room_keeps_its_place(ends) -> None:
    out, rx = ends
    filler = b"x"
    with pytest.raises(WouldBlock):
        while True:  # fill the ring to its last byte
            out.tx.send_nowait(codec.dumps(filler))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(out.send, "first")
        await trio.testing.wait_all_tasks_blocked()
        assert out.lock.locked()  # it waits for room, holding its place
        assert not out.send_now("second")  # so nobody gets past it
        nursery.start_soon(out.send, "second")
        await trio.testing.wait_all_tasks_blocked()
        got: list[object] = []
        with trio.fail_after(10):
            async with aclosing(frames(rx)) as messages:
                async for msg in messages:
                    got.append(msg)
                    if msg == "second":
                        break
    assert [m for m in got if m != filler] == ["first", "second"]


async def test_then_follows_the_rings_order_of_senders_at_once(ends) -> None:
    """The tokenizer queues number each request as it is sent and take an answer
    to a later number as news that an earlier one was lost. Numbered after send()
    returned, 50 requests sent at once were numbered in the order trio woke their
    tasks, not the ring's, and requests still queued were sent again."""
    out, rx = ends
    numbered: list[int] = []

    async def send(i: int) -> None:
        await out.send(i, then=lambda: numbered.append(i))

    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(send, i)
    assert numbered == drain(rx)
    # and senders that waited for room (a filler frame as large as theirs)
    with pytest.raises(WouldBlock):
        while True:
            out.tx.send_nowait(codec.dumps(0))
    numbered.clear()
    async with trio.open_nursery() as nursery:
        for i in range(1, 4):
            nursery.start_soon(send, i)
        await trio.testing.wait_all_tasks_blocked()
        assert numbered == []  # nothing sent yet: nothing numbered
        got = drain(rx)
    got += drain(rx)
    assert numbered == [m for m in got if m != 0]

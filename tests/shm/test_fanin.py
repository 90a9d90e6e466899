"""One consumer reading several rings fairly."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from rt.errors import EndOfChannel, WouldBlock
from rt.shm import Doorbell, FanInReceiver, Ring, RingSender, new_run_prefix


@pytest.fixture
def rings():
    prefix, bell = new_run_prefix(), Doorbell.create()
    rings = [Ring.create(prefix, f"in{i}", capacity=1 << 14, data_bell=bell) for i in range(3)]
    yield rings
    for ring in rings:
        ring.close()
    bell.close()


async def test_no_ring_starves_another(rings) -> None:
    senders = [RingSender.attach(r.spec) for r in rings]
    for i in range(50):
        senders[0].send_nowait(b"busy%d" % i)  # one busy producer
    senders[2].send_nowait(b"quiet")
    fan = FanInReceiver.attach([r.spec for r in rings])
    first_four = [fan.receive_nowait() for _ in range(4)]
    assert b"quiet" in [bytes(f.data) for f in first_four]
    assert {f.source for f in first_four} == {0, 2}
    for f in first_four:
        fan.commit(f)
    rest = [fan.receive_nowait() for _ in range(47)]
    assert [bytes(f.data) for f in rest] == [b"busy%d" % i for i in range(3, 50)]
    with pytest.raises(WouldBlock):
        fan.receive_nowait()
    for s in senders:
        s.close()
    with pytest.raises(EndOfChannel):
        await fan.receive()
    fan.close()


async def test_any_producer_wakes_the_parked_consumer(rings) -> None:
    senders = [RingSender.attach(r.spec) for r in rings]
    fan = FanInReceiver.attach([r.spec for r in rings])
    got = []

    async def consume() -> None:
        for _ in range(3):
            frame = await fan.receive()
            got.append((frame.source, bytes(frame.data)))
            fan.commit(frame)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            for i in (2, 0, 1):
                await trio.testing.wait_all_tasks_blocked()
                await senders[i].send(b"from %d" % i)
    assert got == [(2, b"from 2"), (0, b"from 0"), (1, b"from 1")]
    for s in senders:
        s.close()
    fan.close()


def test_fan_in_rings_must_share_a_doorbell() -> None:
    prefix = new_run_prefix()
    with (
        Ring.create(prefix, "a", 4096) as a,
        Ring.create(prefix, "b", 4096) as b,
        pytest.raises(ValueError, match="share one data doorbell"),
    ):
        FanInReceiver.attach([a.spec, b.spec])

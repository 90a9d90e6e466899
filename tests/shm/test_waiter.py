"""Waiting: spins that do not pay make the next waits park at once, and every
wait is a trio checkpoint. (A parked endpoint's CPU beside a busy process:
test_ring_processes.py; the policy itself: test_spin.py.)"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
import trio
import trio.testing

from rt.errors import Closed
from rt.shm import Ring, RingReceiver, RingSender, new_run_prefix, waiter
from rt.shm.spin import MISSES_TO_BACK_OFF, SPIN_HOT_S, Spin


@pytest.fixture
def pair() -> Iterator[tuple[RingSender, RingReceiver]]:
    with (
        Ring.create(new_run_prefix(), "wait", capacity=4096) as ring,
        RingSender.attach(ring.spec) as tx,
        RingReceiver.attach(ring.spec) as rx,
    ):
        yield tx, rx


async def test_spins_that_do_not_pay_make_the_next_waits_park_at_once(
    pair: tuple[RingSender, RingReceiver],
) -> None:
    tx, rx = pair
    policy = rx._waiter.policy
    for _ in range(MISSES_TO_BACK_OFF):  # long spins that a prompt answer came just after
        now = time.perf_counter()
        policy.record(Spin.MISSED, SPIN_HOT_S, now - 3 * SPIN_HOT_S, now)
    assert policy.budget(time.perf_counter()) == 0.0

    async def send_soon() -> None:
        await trio.sleep(0.01)
        tx.send_nowait(b"late")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_soon)
        assert await rx.receive_data() == b"late"  # parked at once, woken by the doorbell
    assert rx.statistics().sleeps == 1


async def test_every_receive_and_send_is_a_checkpoint_whether_it_parked_or_not(
    pair: tuple[RingSender, RingReceiver],
) -> None:
    tx, rx = pair
    with trio.testing.assert_checkpoints():
        await tx.send(b"ready")
    with trio.testing.assert_checkpoints():
        assert await rx.receive_data() == b"ready"  # no wait at all

    async def send_soon() -> None:
        await trio.sleep(0.01)
        tx.send_nowait(b"later")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_soon)
        with trio.testing.assert_checkpoints():
            assert await rx.receive_data() == b"later"  # parked: no second checkpoint
    assert rx.statistics().sleeps == 1


async def test_closing_an_endpoint_another_task_is_parked_on_says_closed(
    pair: tuple[RingSender, RingReceiver],
) -> None:
    _, rx = pair  # both ends in this process: parked with a timeout, not on a pidfd

    async def close_soon() -> None:
        await trio.testing.wait_all_tasks_blocked()
        rx.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(close_soon)
        with trio.fail_after(5), pytest.raises(Closed, match="closed while a task waited"):
            await rx.receive()


async def test_a_waiter_whose_peers_share_its_one_cpu_parks_without_spinning(
    pair: tuple[RingSender, RingReceiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    tx, rx = pair
    budgets: list[float] = []

    def spin(ready: Callable[[], bool], start: float, budget: float) -> Spin:
        budgets.append(budget)
        return spin_for_real(ready, start, budget)

    spin_for_real = waiter.spin
    monkeypatch.setattr(waiter, "spin", spin)

    async def send_soon() -> None:
        await trio.sleep(0.01)
        tx.send_nowait(b"late")

    for one_cpu in (False, True):
        rx._waiter.one_cpu = one_cpu
        budgets.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_soon)
            assert await rx.receive_data() == b"late"
        rx.commit()
        if one_cpu:
            assert budgets == [], f"spun for {budgets} s on a CPU its peer needs"
        else:  # the comparison: a waiter with CPUs to spare spins before it parks
            assert len(budgets) == 1 and budgets[0] > 0


def test_oversubscription_is_seen_beside_more_busy_processes_than_cores() -> None:
    if waiter.CORES > 8:
        pytest.skip("needs as many busy processes as cores, plus one")
    code = "import time\nend = time.monotonic() + 20\nwhile time.monotonic() < end: pass"
    busy = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(waiter.CORES + 1)]
    try:
        deadline = time.monotonic() + 10
        while not waiter.oversubscribed():
            assert time.monotonic() < deadline, "never saw more runnable threads than cores"
            time.sleep(0.05)
    finally:
        for proc in busy:
            proc.kill()
        for proc in busy:
            proc.wait()

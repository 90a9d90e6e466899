"""A frame the ring handed over is never lost to a cancellation."""

from __future__ import annotations

import trio

from rt.actors import FaultPlan, Faults
from rt.actors.mailbox import Inbox
from rt.shm import Ring, RingReceiver, RingSender, new_run_prefix


async def test_a_receive_cancelled_during_a_planned_delay_keeps_its_frame() -> None:
    plan = FaultPlan.from_dict(
        {"seed": 1, "faults": [{"point": "receive", "action": "delay", "delay_ms": 5000}]}
    )
    with (
        Ring.create(new_run_prefix(), "cancel", 4096) as ring,
        RingSender.attach(ring.spec) as tx,
        RingReceiver.attach(ring.spec) as rx,
    ):
        inbox = Inbox("in", rx, Faults(plan, "a", 1), lambda: None)
        tx.send_nowait(b"precious")
        with trio.move_on_after(0.05) as scope:
            await inbox.receive()
        assert scope.cancelled_caught, "the planned delay should have been cancelled"
        with trio.fail_after(5):  # without the fix the frame is gone and this waits forever
            frame = await inbox.receive()  # the rule fired once; this one passes
        assert bytes(frame.data) == b"precious" and frame.offset == 0

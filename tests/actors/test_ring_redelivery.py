"""A restarted child reattaches to its rings and gets what its predecessor had
not committed."""

from __future__ import annotations

import pytest
import trio
from sample_actors import Forward

from rt.actors import ActorSpec, ActorState, FaultPlan, RingDecl, SupervisorSpec, open_supervisor
from rt.actors.faults import Faults
from rt.actors.mailbox import Inbox
from rt.errors import WouldBlock
from rt.shm import Ring, RingReceiver, RingSender
from rt.shm.segment import new_run_prefix


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "in-a-subtree"])
async def test_a_frame_received_but_not_committed_is_handled_by_the_successor(
    nested: bool,
) -> None:
    # incarnation 1 receives the first frame, then SIGKILLs itself before committing it
    plan = FaultPlan.from_dict(
        {"faults": [{"actor": "fwd", "point": "step", "action": "sigkill", "incarnation": 1}]}
    )
    fwd = ActorSpec("fwd", Forward, inboxes=("in",), outboxes=("out",))
    child = SupervisorSpec(children=(fwd,), name="sub", backoff_initial=0.01) if nested else fwd
    spec = SupervisorSpec(
        children=(child,),
        rings=(RingDecl("in", 1 << 12), RingDecl("out", 1 << 12)),
        backoff_initial=0.01,
    )
    async with open_supervisor(spec, fault_plan=plan) as sup:
        tx = RingSender.attach(sup.ring("in").spec)
        rx = RingReceiver.attach(sup.ring("out").spec)
        try:
            await tx.send(b"hello")
            with trio.fail_after(20):
                status = await sup.wait_for(
                    lambda s: (
                        s.actor("fwd").incarnation == 2
                        and s.actor("fwd").state is ActorState.RUNNING
                    )
                )
                assert status.actor("fwd").last_exit_reason == "killed by SIGKILL"
                frame = await rx.receive()
                # same offset, second incarnation, the second consumer to handle it
                assert bytes(frame.data) == b"hello|0|2|2"
                rx.commit(frame)
                await tx.send(b"world")
                frame = await rx.receive()
                assert bytes(frame.data).startswith(b"world|")
                assert bytes(frame.data).endswith(b"|2|1")
                rx.commit(frame)
            assert sup.status().actor("fwd").restart_count == 1
        finally:
            tx.close()
            rx.close()


async def test_duplicate_on_receive_and_drop_on_send_through_real_rings() -> None:
    plan = FaultPlan.from_dict(
        {
            "faults": [
                {"actor": "fwd", "point": "receive", "action": "duplicate"},
                {"actor": "fwd", "point": "send", "action": "drop", "after": 2},
            ]
        }
    )
    spec = SupervisorSpec(
        children=(ActorSpec("fwd", Forward, inboxes=("in",), outboxes=("out",)),),
        rings=(RingDecl("in", 1 << 12), RingDecl("out", 1 << 12)),
    )
    async with open_supervisor(spec, fault_plan=plan) as sup:
        tx = RingSender.attach(sup.ring("in").spec)
        rx = RingReceiver.attach(sup.ring("out").spec)
        try:
            for payload in (b"A", b"B", b"C"):
                await tx.send(payload)
            received = []
            with trio.fail_after(20):
                for _ in range(3):
                    frame = await rx.receive()
                    received.append(bytes(frame.data).split(b"|")[0])
                    rx.commit(frame)
            # A is delivered twice (duplicate), B's forward is the 3rd send (dropped)
            assert received == [b"A", b"A", b"C"]
            assert sup.status().actor("fwd").restart_count == 0
        finally:
            tx.close()
            rx.close()


def test_inbox_receive_nowait_passes_the_receive_point() -> None:
    plan = FaultPlan.from_dict({"faults": [{"point": "receive", "action": "duplicate"}]})
    with Ring.create(new_run_prefix(), "inbox", 4096) as ring:
        tx, rx = RingSender.attach(ring.spec), RingReceiver.attach(ring.spec)
        try:
            inbox = Inbox("in", rx, Faults(plan, "a"), beat=lambda: None)
            tx.send_nowait(b"A")
            tx.send_nowait(b"B")
            frames = [inbox.receive_nowait() for _ in range(3)]
            assert [bytes(f.data) for f in frames] == [b"A", b"A", b"B"]
            with pytest.raises(WouldBlock):
                inbox.receive_nowait()
            assert inbox.mark(frames[2]) == 1
            inbox.commit(frames[2])
        finally:
            tx.close()
            rx.close()


async def test_an_actor_whose_producer_closed_its_inbox_ends_normally() -> None:
    fwd = ActorSpec("fwd", Forward, inboxes=("in",), outboxes=("out",), restart="transient")
    spec = SupervisorSpec(children=(fwd,), rings=(RingDecl("in", 4096), RingDecl("out", 4096)))
    async with open_supervisor(spec) as sup:
        RingSender.attach(sup.ring("in").spec).close()  # EndOfChannel for the actor
        with trio.fail_after(20):
            status = await sup.wait_for(lambda s: s.actor("fwd").state is ActorState.STOPPED)
        assert status.actor("fwd").last_exit_reason == "exit code 0"

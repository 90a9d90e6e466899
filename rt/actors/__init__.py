"""Supervised actor processes: spawning, supervision, heartbeats, fault injection.

rt/actors knows nothing of LLMs: an actor is any :class:`Actor` whose
``run(ctx)`` reads its inbox rings and writes its outboxes, in a process of
its own, under ``trio.run``::

    spec = SupervisorSpec(
        children=(
            ActorSpec("tok0", TokenizerActor, args=(0,), inboxes=("front-tok0",),
                      outboxes=("tok0-sched",)),
            ActorSpec("sched", SchedulerActor, inboxes=("tok0-sched",), restart="permanent"),
        ),
        rings=(RingDecl("front-tok0"), RingDecl("tok0-sched")),
        strategy="rest_for_one", max_restarts=5, max_seconds=60, watchdog_timeout=10,
    )
    async with open_supervisor(spec, fault_plan=FaultPlan.from_env()) as sup:
        tx = RingSender.attach(sup.ring("front-tok0").spec)   # the parent's end
        sup.status()                                          # frozen snapshot
        await sup.wait_for(lambda s: s.actor("sched").state is ActorState.RUNNING)

See docs/architecture.md for the package's role.
"""

from __future__ import annotations

from rt.actors.actor import Actor, ActorContext
from rt.actors.faultplan import FaultKind, FaultPlan, FaultRule
from rt.actors.faults import NO_FAULTS, Faults, FiredFault, Verdict
from rt.actors.main import run_main
from rt.actors.spec import ActorSpec, Restart, RingDecl, Strategy, SupervisorSpec
from rt.actors.status import ActorState, ActorStatus, SupervisorStatus
from rt.actors.supervisor import Supervisor, open_supervisor

__all__ = [
    "NO_FAULTS",
    "Actor",
    "ActorContext",
    "ActorSpec",
    "ActorState",
    "ActorStatus",
    "FaultKind",
    "FaultPlan",
    "FaultRule",
    "Faults",
    "FiredFault",
    "Restart",
    "RingDecl",
    "Strategy",
    "Supervisor",
    "SupervisorSpec",
    "SupervisorStatus",
    "Verdict",
    "open_supervisor",
    "run_main",
]

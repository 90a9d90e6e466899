"""Supervised actor processes: spawning, supervision, heartbeats, fault injection.

See docs/architecture.md for this package's role. rt/actors knows nothing
of LLMs: an actor is any :class:`Actor` whose ``run`` reads its inbox rings
and writes its outboxes in a process of its own.
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

"""The public surface of rt.actors, pinned (as trio's test_exports does)."""

from __future__ import annotations

import rt.actors


def test_public_names() -> None:
    assert sorted(rt.actors.__all__) == sorted(
        [
            "NO_FAULTS", "Actor", "ActorContext", "ActorSpec", "ActorState", "ActorStatus",
            "FaultKind", "FaultPlan", "FaultRule", "Faults", "FiredFault", "Restart", "RingDecl",
            "Strategy", "Supervisor", "SupervisorSpec", "SupervisorStatus", "Verdict",
            "open_supervisor", "run_main",
        ]
    )  # fmt: skip
    for name in rt.actors.__all__:
        assert getattr(rt.actors, name) is not None

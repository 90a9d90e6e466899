"""Helpers the supervision tests share: a spec with quick restarts, and bounded waits."""

from __future__ import annotations

from collections.abc import Callable

import trio

from rt.actors import ActorSpec, ActorState, Supervisor, SupervisorSpec, SupervisorStatus

TIMEOUT = 20  # generous: 2 shared cores; each wait normally ends in a few s at most


def quick_spec(*children: ActorSpec, **options: object) -> SupervisorSpec:
    options.setdefault("backoff_initial", 0.01)
    return SupervisorSpec(children=children, **options)  # type: ignore[arg-type]


async def wait_until(
    sup: Supervisor, predicate: Callable[[SupervisorStatus], bool]
) -> SupervisorStatus:
    with trio.fail_after(TIMEOUT):
        return await sup.wait_for(predicate)


def is_running(name: str, incarnation: int) -> Callable[[SupervisorStatus], bool]:
    def check(status: SupervisorStatus) -> bool:
        actor = status.actor(name)
        return actor.incarnation == incarnation and actor.state is ActorState.RUNNING

    return check

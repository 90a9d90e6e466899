"""A process whose main is a supervisor, for the tests that signal or kill it.

python supervisor_script.py idle       two idle children; prints their pids, the prefix
python supervisor_script.py escalate   a child that fails start-up forever
"""

from __future__ import annotations

import json
import sys

import trio
from sample_actors import FailingStartup, Idle

from rt.actors import ActorSpec, RingDecl, Supervisor, SupervisorSpec, run_main


async def _announce_then_run(spec: SupervisorSpec) -> None:
    supervisor = Supervisor(spec, handle_signals=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        pids = [a.pid for a in supervisor.status().actors]
        reaper = supervisor._reaper.pid if supervisor._reaper else None  # rt/shm/reaper.py
        print(json.dumps({"pids": pids, "prefix": supervisor.prefix, "reaper": reaper}), flush=True)


def main(mode: str) -> int:
    if mode == "idle":
        spec = SupervisorSpec(
            children=(ActorSpec("a", Idle), ActorSpec("b", Idle)), rings=(RingDecl("r", 4096),)
        )
        trio.run(_announce_then_run, spec)
        return 0
    spec = SupervisorSpec(
        children=(ActorSpec("doomed", FailingStartup),), max_restarts=1, backoff_initial=0.01
    )
    return run_main(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

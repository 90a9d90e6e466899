"""A scheduler that dies on cue, for the recovery tests. Importable by the
children: the parent's sys.path travels to them, and pytest puts this folder
on it.

A request whose prompt starts with ``MARK`` kills the process (``os._exit``)
in every step it takes part in, as a kernel fault or an out-of-memory error
triggered by one request's shape would: there is no exception to catch.

``SlowToDieScheduler`` takes as long as the test says to finish exiting once
its run has raised.
"""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path
from typing import Any

from rt.actors import ActorContext
from rt.pipeline.scheduler import SchedulerActor

MARK = [5, 5, 5, 5, 5, 5, 5, 5]


class CrashyScheduler(SchedulerActor):
    async def startup(self, ctx: ActorContext) -> None:
        await super().startup(ctx)
        step = self.engine.step

        def crashy() -> Any:
            held = [reqs[0] for reqs in self.engine.reqs.values()]
            held += list(self.engine._incoming)
            if any(req.input_ids[: len(MARK)] == MARK for req in held):
                os._exit(1)
            return step()

        self.engine.step = crashy  # type: ignore[method-assign]


class SlowToDieScheduler(SchedulerActor):
    """A scheduler whose first incarnation, once its run has raised, does not
    finish exiting until the file named by ``$RT_TEST_EXIT_GATE`` exists: a
    teardown as slow as the test needs (a real one takes 0.1-3.8 s)."""

    async def run(self, ctx: ActorContext) -> None:
        if ctx.incarnation == 1:
            atexit.register(_wait_for_file, Path(os.environ["RT_TEST_EXIT_GATE"]))
        await super().run(ctx)


def _wait_for_file(path: Path) -> None:
    while not path.exists():
        time.sleep(0.01)

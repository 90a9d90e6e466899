"""A scheduler that is slow to die, for the recovery tests. Importable by the
children: the parent's sys.path travels to them, and pytest puts this folder
on it.

``SlowToDieScheduler`` takes as long as the test says to finish exiting once
its run has raised.
"""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path

from rt.actors import ActorContext
from rt.pipeline.scheduler import SchedulerActor


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

"""Running a supervisor as a process's main: exit codes and signals."""

from __future__ import annotations

import logging
import sys
from functools import partial

import trio

from rt.actors.faultplan import FaultPlan
from rt.actors.spec import SupervisorSpec
from rt.actors.supervisor import Supervisor
from rt.errors import EscalationError

EXIT_OK = 0
EXIT_ESCALATED = 3  # the restart intensity was exceeded; everything was shut down


def run_main(spec: SupervisorSpec, *, fault_plan: FaultPlan | None = None) -> int:
    """Run ``spec`` until SIGINT/SIGTERM (exit 0) or an escalation (exit 3, the
    reason on stderr). Use as ``sys.exit(run_main(spec))``."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    supervisor = Supervisor(spec, fault_plan=fault_plan, handle_signals=True)
    try:
        trio.run(partial(supervisor.run))
    except EscalationError as err:
        sys.stderr.write(f"rt: {err}\n")
        return EXIT_ESCALATED
    return EXIT_OK

"""rt.chaos: seeded fault campaigns against an rt engine, with a ledger and checkers.

A campaign draws a fault schedule and a load from one seed, runs the load
through an engine (rt-serve over HTTP SSE and WebSocket, or
``rt.open_engine`` in this process) while the faults fire, writes every
request's history and every fault to a ledger (JSON lines), and checks it:
no request lost or hung, no stream with duplicated, missing or reordered
text, outputs equal to an uninterrupted run (float32) or, token by token,
what a run conditioned on their own prefix draws (bfloat16), no
cross-request mix-up, the engine up, nothing leaked. A failing schedule is
shrunk to the shortest that still fails.

The layers, each a module of its own:

    schedule, draw       the faults (pure)          workload   the requests (pure)
    ledger               the history (JSON lines)   checks     the checkers (pure)
    figures              detection, restore, health gap (pure)
    shrink               delta debugging (pure but for the replays it awaits)
    reference, verdict   the engine core alone: what an uninterrupted run produces
    transports, ws       one request over the engine, SSE or WebSocket
    load, monitor, inject, targets, server, hogs, run, http_run   one run
    campaign, report, cli                                          rt-chaos

``python -m rt.chaos --help`` (the ``rt-chaos`` console script) runs one;
:mod:`rt.testing` holds the pieces a test suite wants.
"""

from __future__ import annotations

from rt.chaos.campaign import CampaignConfig, Outcome, campaign
from rt.chaos.checks import Finding
from rt.chaos.draw import draw_schedule
from rt.chaos.ledger import Ledger
from rt.chaos.run import RunConfig
from rt.chaos.schedule import Fault, Schedule, ScheduleConfig
from rt.chaos.workload import RequestSpec, WorkloadConfig, draw_request

__all__ = [
    "CampaignConfig",
    "Fault",
    "Finding",
    "Ledger",
    "Outcome",
    "RequestSpec",
    "RunConfig",
    "Schedule",
    "ScheduleConfig",
    "WorkloadConfig",
    "campaign",
    "draw_request",
    "draw_schedule",
]

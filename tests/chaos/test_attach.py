"""rt/chaos/attach.py: what an attached rt-serve's /server_info decides."""

from __future__ import annotations

import pytest

from rt.chaos.attach import (
    AttachError,
    Served,
    check_restart_limit,
    of_info,
    restarts_at_once,
)
from rt.chaos.schedule import Fault, Schedule


def kill(i: int, wait_s: float) -> Fault:
    return Fault(i, "sigkill", "scheduler", "signal", "stream", wait_s=wait_s)


def test_the_replays_load_what_the_server_serves() -> None:
    info = {
        "model": {"path": "/models/m"},
        "config": {"device": "cpu", "dtype": "float32", "load_format": "dummy"},
    }
    info["config"] |= {"max_restarts": 5, "restart_window": 60.0}
    assert of_info(info) == Served("cpu", "float32", "/models/m", "dummy", 5, 60.0)


def test_restarts_within_a_window_count_kills_and_stops_left_to_the_watchdog() -> None:
    faults = [kill(0, 1.0), kill(1, 1.0), kill(2, 100.0), kill(3, 1.0)]
    faults.append(Fault(4, "sigstop", "scheduler", "signal", "stream", wait_s=1.0, stop_s=0.5))
    faults.append(Fault(5, "sigstop", "scheduler", "signal", "stream", wait_s=1.0))
    assert restarts_at_once(Schedule(1, tuple(faults)), 60.0) == 3  # (2, 3 and 5)
    assert restarts_at_once(Schedule(1, ()), 60.0) == 0


def test_a_schedule_past_the_servers_restart_limit_is_refused_saying_what_to_change() -> None:
    """A server's default allows 5 restarts in 60 s; a run of 10 quick faults made it
    give up, as it should, and rt-chaos reported the server as failing."""
    server = Served("cpu", "float32", "/m", "auto", 5, 60.0)
    schedule = Schedule(1, tuple(kill(i, 1.0) for i in range(10)))
    with pytest.raises(AttachError, match=r"10 times within 60 s.*--max-restarts 25"):
        check_restart_limit(schedule, server)
    check_restart_limit(Schedule(1, tuple(kill(i, 1.0) for i in range(5))), server)
    check_restart_limit(schedule, Served("cpu", "float32", "/m", "auto", 10, 60.0))

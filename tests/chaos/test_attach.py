"""rt/chaos/attach.py: what an attached rt-serve's /server_info decides."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rt.chaos.attach import (
    AttachError,
    Served,
    check_restart_limit,
    of_info,
    restarts_at_once,
    spaced,
)
from rt.chaos.draw import draw_schedule
from rt.chaos.schedule import SIGNAL_KINDS, Fault, Schedule, ScheduleConfig


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


@pytest.mark.parametrize("budget", [(5, 60.0), (1, 60.0), (3, 10.0), (19, 60.0)])
def test_a_schedule_drawn_for_an_attached_server_fits_its_restart_limit(
    budget: tuple[int, float],
) -> None:
    """The documented runs (`rt-chaos --url URL --duration 5m` beside a server at its
    default flags) were refused: 18 restarts in 60 s asked of a server that allows
    5. Drawn for the server, the faults are spread out to fit it."""
    server = Served("cpu", "float32", "/m", "auto", *budget)
    attached = ScheduleConfig(kinds=SIGNAL_KINDS, signal_share=1.0)
    for seed in range(20):
        for count in (8, 20, 40):
            config = spaced(replace(attached, faults=count), server)
            schedule = draw_schedule(seed, config)
            assert len(schedule.faults) == count
            assert restarts_at_once(schedule, server.restart_window) <= server.max_restarts
            check_restart_limit(schedule, server)
            if config.min_wait_s > 2.0:  # (two restarts at once: left out when spread)
                assert all(f.phase != "restart" for f in schedule.faults)


def test_a_server_with_room_for_the_faults_gets_them_as_drawn() -> None:
    roomy = Served("cpu", "float32", "/m", "auto", 1000, 60.0)
    assert spaced(ScheduleConfig(), roomy) == ScheduleConfig()
    none = Served("cpu", "float32", "/m", "auto", 0, 60.0)  # (refused by the check, as before)
    assert spaced(ScheduleConfig(), none) == ScheduleConfig()


def test_a_run_of_a_given_length_gets_the_faults_it_has_room_for() -> None:
    """A 90 s run at a default server's limit: 8 faults 13 s apart, 2 never fired."""
    server = Served("cpu", "float32", "/m", "auto", 5, 60.0)
    for seconds in (30.0, 90.0, 300.0):
        config = spaced(ScheduleConfig(faults=40), server, duration=seconds)
        waits = sum(f.wait_s for f in draw_schedule(1, config).faults if f.via == "signal")
        assert config.faults >= 1 and waits < seconds, (config.faults, waits)
    assert spaced(ScheduleConfig(faults=40), server, duration=300.0).faults >= 15

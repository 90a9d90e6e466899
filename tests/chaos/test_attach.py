"""rt/chaos/attach.py: what an attached rt-serve's /server_info decides."""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from rt.chaos.attach import (
    AttachError,
    Served,
    check_restart_limit,
    of_info,
    restarts_at_once,
    spaced,
)
from rt.chaos.campaign import CampaignConfig, fitted_to
from rt.chaos.checks import Finding, unexplained_exits
from rt.chaos.draw import draw_schedule
from rt.chaos.ledger import Ledger
from rt.chaos.run import RunConfig
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
    # left to a watchdog of 60 s, the last stop restarts its actor at 165, not 105
    assert restarts_at_once(Schedule(1, tuple(faults)), 60.0, stop_restart_s=60.0) == 2


def test_a_schedule_past_the_servers_restart_limit_is_refused_saying_what_to_change() -> None:
    """A server's default allows 5 restarts in 60 s; a run of 10 quick faults made it
    give up, as it should, and rt-chaos reported the server as failing."""
    server = Served("cpu", "float32", "/m", "auto", 5, 60.0)
    schedule = Schedule(1, tuple(kill(i, 1.0) for i in range(10)))
    with pytest.raises(AttachError, match=r"10 times within 60 s.*--max-restarts 25"):
        check_restart_limit(schedule, server)
    check_restart_limit(Schedule(1, tuple(kill(i, 1.0) for i in range(5))), server)
    check_restart_limit(schedule, Served("cpu", "float32", "/m", "auto", 10, 60.0))


def test_an_attached_runs_checks_wait_a_stop_for_the_servers_watchdog() -> None:
    """rt-chaos's own --watchdog-timeout (4 s) judged an attached server's exits:
    a stop its watchdog (30 s) restarted was "an exit with no fault to explain it"."""
    info = {"model": {"path": "/m"}, "config": {"device": "cpu", "dtype": "float32"}}
    info["config"] |= {"max_restarts": 5, "restart_window": 60.0, "watchdog_timeout": 30.0}
    server = of_info(info)
    ours = CampaignConfig(
        RunConfig(seed=1, mode="attach", url="http://x", engine={"watchdog_timeout": 4.0}),
        ScheduleConfig(watchdog_s=4.0),
    )
    stop = {"ev": "fault", "t": 10.0, "id": 0, "kind": "sigstop", "actor": "detokenizer"}
    restarted = {"ev": "actor", "t": 42.5, "name": "detokenizer", "restarts": 1,
                 "exit_at": 42.4, "reason": "watchdog: no heartbeat for 32.40 s"}  # fmt: skip
    before = {"ev": "actor", "t": 0.0, "name": "detokenizer", "restarts": 0}

    def exits(config: CampaignConfig) -> list[Finding]:
        run = {"ev": "run", "config": asdict(config.run)}
        return unexplained_exits(Ledger.of([run, before, stop, restarted]))

    assert [f.checker for f in exits(ours)] == ["engine"]
    fitted = fitted_to(ours, server)
    assert fitted.run.engine["watchdog_timeout"] == 30.0 and exits(fitted) == []
    assert fitted.schedule.min_wait_s > 13  # (and spread out to fit 5 restarts in 60 s)
    # a stop to continue is drawn under half the server's watchdog, not rt-chaos's 4 s
    # (beside a server's 1 s one, 180 of 200 schedules held a stop that outlived it)
    quick = replace(server, watchdog_timeout=1.0)
    stops = [f.stop_s for f in draw_schedule(3, fitted_to(ours, quick).schedule).faults
             if f.kind == "sigstop" and f.stop_s is not None]  # fmt: skip
    assert stops and max(stops) <= 0.5


@pytest.mark.parametrize("budget", [(5, 60.0), (1, 60.0), (3, 10.0), (19, 60.0)])
def test_a_schedule_drawn_for_an_attached_server_fits_its_restart_limit(
    budget: tuple[int, float],
) -> None:
    """The documented runs (`rt-chaos --url URL --duration 5m` beside a server at its
    default flags) were refused: 18 restarts in 60 s asked of a server that allows
    5. Drawn for the server, the faults are spread out to fit it."""
    server = Served("cpu", "float32", "/m", "auto", *budget, watchdog_timeout=30.0)
    attached = ScheduleConfig(kinds=SIGNAL_KINDS, signal_share=1.0)
    for seed in range(20):
        for count in (8, 20, 40):
            config = spaced(replace(attached, faults=count), server)
            schedule = draw_schedule(seed, config)
            assert len(schedule.faults) == count
            # a stop left to the watchdog restarts its actor 30 s after it fired: the
            # restarts, not only the faults, must fit (72 of 200 drawn schedules did not)
            need = restarts_at_once(schedule, server.restart_window, server.watchdog_timeout)
            assert need <= max(1, server.max_restarts - 1), (seed, count, need)
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

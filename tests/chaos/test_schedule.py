"""The schedule and its drawing: pure, deterministic, covering, and valid as rt's plans."""

from __future__ import annotations

import re

import pytest

from rt.actors.faultplan import BUILTIN_POINTS, FaultPlan
from rt.chaos.draw import draw_schedule
from rt.chaos.schedule import (
    CRASHES,
    KINDS,
    MAIN_KINDS,
    POINTS,
    Fault,
    Schedule,
    ScheduleConfig,
    role,
)

ACTORS = ("tokenizer0", "scheduler", "detokenizer")


def test_the_same_seed_draws_the_same_schedule_and_another_seed_another() -> None:
    config = ScheduleConfig(faults=20, poison=2)
    assert draw_schedule(7, config) == draw_schedule(7, config)
    assert draw_schedule(7, config) != draw_schedule(8, config)


def test_a_schedule_covers_every_kind_and_every_actor() -> None:
    for seed in range(20):
        schedule = draw_schedule(seed, ScheduleConfig(faults=len(MAIN_KINDS)))
        kinds = {f.kind for f in schedule.faults}
        # a sigstop drawn where no signal phase is allowed becomes a hang: never here
        assert kinds == set(MAIN_KINDS)
        assert {f.actor for f in schedule.faults} == set(ACTORS)


def test_plan_faults_are_valid_rules_at_points_the_actors_pass() -> None:
    from rt.pipeline.detokenizer import DetokenizerActor
    from rt.pipeline.scheduler import SchedulerActor
    from rt.pipeline.tokenizer import TokenizerActor

    points = {
        "tokenizer0": BUILTIN_POINTS | TokenizerActor.fault_points,
        "scheduler": BUILTIN_POINTS | SchedulerActor.fault_points,
        "detokenizer": BUILTIN_POINTS | DetokenizerActor.fault_points,
    }
    for name, passed in points.items():
        assert set(POINTS[role(name)]) <= passed
    for seed in range(30):
        schedule = draw_schedule(seed, ScheduleConfig(kinds=KINDS, faults=30, poison=3))
        plan = schedule.plan()
        assert plan is not None
        FaultPlan.from_dict(plan).check_points(points)  # raises on a bad rule or point


def test_crashes_of_one_actor_are_pinned_to_successive_incarnations() -> None:
    """Counters restart with each incarnation: the k-th planned crash of an actor
    fires in its k-th incarnation, so they come one after another."""
    schedule = draw_schedule(
        3, ScheduleConfig(kinds=("sigkill", "exit", "raise"), faults=18, signal_share=0.0)
    )
    for actor in ACTORS:
        crashes = [f for f in schedule.faults if f.actor == actor and f.kind in CRASHES]
        assert [f.incarnation for f in crashes] == list(range(1, len(crashes) + 1))


def test_startup_faults_are_start_up_or_restart_phases() -> None:
    faults = [
        f
        for seed in range(40)
        for f in draw_schedule(seed, ScheduleConfig(faults=12)).faults
        if f.point == "startup"
    ]
    assert faults, "no start-up fault in 40 seeds"
    for f in faults:
        assert f.phase == ("startup" if f.incarnation == 1 else "restart")
        assert f.kind in CRASHES


def test_phases_and_kinds_are_limited_to_those_asked_for() -> None:
    config = ScheduleConfig(kinds=("sigkill", "delay"), phases=("idle", "decode"), faults=30)
    schedule = draw_schedule(1, config)
    assert {f.kind for f in schedule.faults} <= {"sigkill", "delay"}
    assert {f.phase for f in schedule.signals()} <= {"idle", "decode"}
    assert all(f.point != "startup" for f in schedule.faults)


def test_at_most_one_shutdown_fault() -> None:
    for seed in range(30):
        schedule = draw_schedule(seed, ScheduleConfig(faults=40))
        assert sum(f.phase == "shutdown" for f in schedule.faults) <= 1


def test_poison_faults_crash_a_tokenizer_or_the_scheduler_on_their_marker_every_time() -> None:
    schedule = draw_schedule(2, ScheduleConfig(faults=0, poison=3))
    markers = schedule.poison_markers()
    assert markers[0] == "POISON-0" and markers[2] == "POISON-2"
    assert re.fullmatch(r"( \d+){6} ", markers[1]), markers[1]  # six token ids
    rules = [f.rule() for f in schedule.faults]
    assert all(r["times"] == 0 and r["match"] in markers for r in rules)
    assert [(r["actor"], r["point"]) for r in rules] == [
        ("tokenizer*", "tokenize"),
        ("scheduler", "forward"),
        ("tokenizer*", "tokenize"),
    ]
    # without the scheduler in the run, every poison is a tokenizer's
    alone = draw_schedule(2, ScheduleConfig(actors=("tokenizer0",), faults=0, poison=3))
    assert alone.poison_markers() == ["POISON-0", "POISON-1", "POISON-2"]


def test_a_schedule_round_trips_through_json_and_subsets_keep_ids() -> None:
    schedule = draw_schedule(5, ScheduleConfig(faults=10, poison=1))
    assert Schedule.from_json(schedule.to_json()) == schedule
    sub = schedule.subset([1, 4])
    assert [f.id for f in sub.faults] == [1, 4]
    assert sub.seed == schedule.seed


def test_describe_says_what_where_and_when() -> None:
    kill = Fault(
        3, "sigkill", "detokenizer", "plan", "frame", point="receive", after=11, incarnation=2
    )
    assert kill.describe() == "#3 sigkill detokenizer at point receive hit 12, incarnation 2"
    stop = Fault(4, "sigstop", "scheduler", "signal", "decode", stop_s=0.5)
    assert "SIGCONT after 0.50 s" in stop.describe() and not stop.crash
    assert Fault(5, "sigstop", "scheduler", "signal", "decode").crash  # left to the watchdog


def test_bad_faults_and_configs_are_refused() -> None:
    with pytest.raises(AssertionError):
        Fault(0, "sigstop", "scheduler", "plan", "frame", point="receive")
    with pytest.raises(AssertionError):
        ScheduleConfig(kinds=("explode",))


def test_a_sweep_kills_each_actor_at_each_early_frame_one_incarnation_after_another() -> None:
    config = ScheduleConfig(faults=0, sweep=3, sweep_actors=("detokenizer",))
    delay, *kills = draw_schedule(1, config).faults
    assert delay.kind == "delay" and delay.point == "send" and delay.probability == 0.5
    assert [(f.point, f.after + 1, f.incarnation) for f in kills] == [
        ("receive", 1, 1),
        ("receive", 2, 2),
        ("receive", 3, 3),
        ("send", 1, 4),
        ("send", 2, 5),
        ("send", 3, 6),
        ("commit", 1, 7),
        ("commit", 2, 8),
        ("commit", 3, 9),
    ]
    assert all(f.kind == "sigkill" and f.actor == "detokenizer" for f in kills)


def test_a_subset_pins_the_kept_crashes_to_successive_incarnations_again() -> None:
    config = ScheduleConfig(faults=0, sweep=3, sweep_actors=("detokenizer",))
    schedule = draw_schedule(1, config)
    sub = schedule.subset([0, 3, 5])  # the delay, receive hit 3, send hit 2
    assert [(f.id, f.point, f.after + 1, f.incarnation) for f in sub.faults] == [
        (0, "send", 1, None),
        (3, "receive", 3, 1),
        (5, "send", 2, 2),
    ]
    assert sub.subset([5]).faults[0].incarnation == 1


def test_a_backlog_fault_draws_how_long_its_reader_stays_stopped() -> None:
    config = ScheduleConfig(kinds=("sigkill", "sigstop"), phases=("backlog",), faults=20,
                            signal_share=1.0)  # fmt: skip
    faults = draw_schedule(4, config).faults
    assert {f.phase for f in faults} == {"backlog"} and {f.via for f in faults} == {"signal"}
    kills = [f for f in faults if f.kind == "sigkill"]
    assert kills and all(f.stop_s is not None and 0.02 <= f.stop_s <= 0.3 for f in kills)
    assert all(f.crash for f in kills)
    assert "its reader stopped" in kills[0].describe()


def test_a_restart_phase_signal_follows_a_fault_that_can_take_an_actor_down() -> None:
    """A signal fault for the restart phase waits for an actor to be down, and signal
    faults fire in order: drawn first (nothing before it to take one down), it never
    fired, and held back every later fault (an attached run fired none of 10)."""
    config = ScheduleConfig(faults=10, signal_share=1.0, kinds=("sigstop",))
    for seed in range(40):
        for fault in draw_schedule(seed, config).faults:
            # (sigstops alone: none restarts an actor before it for sure)
            assert fault.phase != "restart", (seed, fault)
    kills = ScheduleConfig(faults=10, signal_share=1.0)
    drawn = [f for seed in range(40) for f in draw_schedule(seed, kills).faults]
    assert any(f.phase == "restart" for f in drawn)  # (after a kill, still drawn)
    for seed in range(40):
        faults = draw_schedule(seed, kills).faults
        for i, fault in enumerate(faults):
            if fault.phase == "restart":
                assert any(f.via == "plan" or f.kind in ("sigkill", "sigsegv") for f in faults[:i])

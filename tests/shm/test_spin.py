"""The spin policy (pure, on a fake clock) and the spin loop's verdicts."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from rt.shm.spin import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    DECAY_S,
    HOT_GAP_S,
    MISSES_TO_BACK_OFF,
    PREEMPTED_S,
    SPIN_HOT_S,
    SPIN_S,
    Spin,
    SpinPolicy,
    Window,
    spin,
)

US = 1e-6
T0 = 1000.0  # perf_counter() is far from 0 in a real process


def clock(*times: float) -> Callable[[], float]:
    ticks: Iterator[float] = iter(times)
    return lambda: next(ticks)


def hot(policy: SpinPolicy, at: float) -> float:
    """A wait that the spin ends at once: continuous traffic. Returns its end."""
    policy.record(Spin.READY, policy.budget(at), at, at + 5 * US)
    return at + 5 * US


def test_continuous_traffic_spins_long_and_a_quiet_spell_briefly() -> None:
    policy = SpinPolicy()
    assert policy.budget(T0) == SPIN_S
    hot(policy, T0)
    assert policy.budget(T0 + 1) == SPIN_HOT_S
    policy.record(Spin.MISSED, SPIN_HOT_S, T0 + 1, T0 + 1.5)  # parked 0.5 s: traffic stopped
    assert policy.budget(T0 + 2) == SPIN_S


def test_a_preempted_spin_on_an_oversubscribed_machine_stops_spinning_while_it_lasts() -> None:
    busy = [True]
    policy = SpinPolicy(oversubscribed=lambda: busy[0])
    end = hot(policy, T0)
    policy.record(Spin.PREEMPTED, SPIN_HOT_S, end, end + 3e-4)
    end += 3e-4
    assert policy.budget(end) == 0.0
    assert policy.budget(end + BACKOFF_MIN_S * 0.99) == 0.0
    # The window closes, but the machine is still oversubscribed: no probe, a longer window.
    assert policy.budget(end + BACKOFF_MIN_S) == 0.0
    assert policy.contended.length == 2 * BACKOFF_MIN_S
    busy[0] = False
    later = end + BACKOFF_MIN_S + 2 * BACKOFF_MIN_S
    assert policy.budget(later) == SPIN_HOT_S, "the machine went quiet: long spins again"


def test_a_preemption_while_the_cores_are_not_oversubscribed_changes_nothing() -> None:
    # An interrupt, or the hypervisor taking the vCPU away: spinning keeps it awake.
    policy = SpinPolicy(oversubscribed=lambda: False)
    end = hot(policy, T0)
    policy.record(Spin.PREEMPTED, SPIN_HOT_S, end, end + 3e-4)
    assert policy.budget(end + 3e-4) == SPIN_HOT_S


LATE = 3 * SPIN_HOT_S  # an answer this long after a long spin began: a longer one would not pay


def test_spins_that_keep_missing_an_answer_that_comes_much_later_stop_for_a_while() -> None:
    policy = SpinPolicy()
    end = hot(policy, T0)
    for _ in range(MISSES_TO_BACK_OFF - 1):
        policy.record(Spin.MISSED, SPIN_HOT_S, end, end + LATE)
        end += LATE
        assert policy.budget(end) == SPIN_HOT_S
    end = hot(policy, end)  # a hit breaks the streak
    for _ in range(MISSES_TO_BACK_OFF):
        policy.record(Spin.MISSED, SPIN_HOT_S, end, end + LATE)
        end += LATE
    assert policy.budget(end) == 0.0
    assert policy.budget(end + BACKOFF_MIN_S) > 0, "the wait after the window probes"


def test_misses_that_prove_nothing_leave_spinning_alone() -> None:
    policy = SpinPolicy()
    end = hot(policy, T0)
    for _ in range(10 * MISSES_TO_BACK_OFF):  # a slow wake: the answer just after the spin
        policy.record(Spin.MISSED, SPIN_HOT_S, end, end + 1.5 * SPIN_HOT_S)
        end += 1.5 * SPIN_HOT_S
    assert policy.budget(end) == SPIN_HOT_S
    for i in range(10 * MISSES_TO_BACK_OFF):  # sporadic traffic: every short spin misses
        policy.record(Spin.MISSED, policy.budget(T0 + i), T0 + i, T0 + i + 0.1)
    assert policy.budget(T0 + 100) == SPIN_S
    for i in range(10 * MISSES_TO_BACK_OFF):  # bursts that stop: a long spin, then silence
        hot(policy, T0 + 200 + i)
        policy.record(Spin.MISSED, SPIN_HOT_S, T0 + 200 + i, T0 + 200 + i + 2 * HOT_GAP_S)
    assert hot(policy, T0 + 300) and policy.budget(T0 + 300.1) == SPIN_HOT_S


def test_windows_double_while_the_evidence_keeps_coming_and_stay_bounded() -> None:
    window, now, seen = Window(), T0, []
    for _ in range(12):
        window.extend(now)
        seen.append(window.length)
        now = window.until
    assert seen[:3] == [BACKOFF_MIN_S, 2 * BACKOFF_MIN_S, 4 * BACKOFF_MIN_S]
    assert max(seen) == seen[-1] == BACKOFF_MAX_S


def test_windows_shrink_once_the_evidence_stops() -> None:
    window, now = Window(), T0
    for _ in range(5):
        window.extend(now)
        now = window.until
    level = window.length
    assert level == 16 * BACKOFF_MIN_S
    now += 2 * DECAY_S  # two spells without evidence: a quarter, then doubled by this one
    window.extend(now)
    assert window.length == level / 2
    now += 60 * DECAY_S
    window.extend(now)
    assert window.length == BACKOFF_MIN_S


def test_spin_says_ready_missed_or_preempted() -> None:
    calls = iter([False, False, True])
    assert spin(lambda: next(calls), 0.0, 1.0, clock(US, 2 * US)) is Spin.READY
    ticks = [i * US for i in range(1, 30)]
    assert spin(lambda: False, 0.0, 20 * US, clock(*ticks)) is Spin.MISSED
    gap = [US, 2 * US, 2 * US + 2 * PREEMPTED_S]
    assert spin(lambda: False, 0.0, 1.0, clock(*gap)) is Spin.PREEMPTED

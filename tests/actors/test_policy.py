"""The supervisor's pure decisions: restart types, strategies, intensity, backoff."""

from __future__ import annotations

import pytest

from rt.actors.policy import Backoff, RestartIntensity, affected, should_restart
from rt.actors.spec import ActorSpec, Restart, RingDecl, Strategy, SupervisorSpec
from rt.errors import ConfigError


@pytest.mark.parametrize(
    ("restart", "abnormal", "expected"),
    [
        (Restart.PERMANENT, False, True),
        (Restart.PERMANENT, True, True),
        (Restart.TRANSIENT, False, False),
        (Restart.TRANSIENT, True, True),
        (Restart.TEMPORARY, False, False),
        (Restart.TEMPORARY, True, False),
    ],
)
def test_should_restart(restart: Restart, abnormal: bool, expected: bool) -> None:
    assert should_restart(restart, abnormal) is expected


def test_affected_children_per_strategy() -> None:
    assert list(affected(Strategy.ONE_FOR_ONE, 1, 4)) == [1]
    assert list(affected(Strategy.REST_FOR_ONE, 1, 4)) == [1, 2, 3]
    assert list(affected(Strategy.ONE_FOR_ALL, 1, 4)) == [0, 1, 2, 3]
    with pytest.raises(IndexError):
        affected(Strategy.ONE_FOR_ONE, 4, 4)


def test_intensity_allows_r_restarts_in_t_seconds() -> None:
    intensity = RestartIntensity(max_restarts=3, max_seconds=10.0)
    assert [intensity.record(t) for t in (0.0, 1.0, 2.0)] == [True, True, True]
    assert intensity.record(3.0) is False  # a 4th within 10 s
    assert intensity.recent(3.0) == 4


def test_intensity_forgets_restarts_older_than_the_window() -> None:
    intensity = RestartIntensity(max_restarts=2, max_seconds=10.0)
    assert intensity.record(0.0) and intensity.record(5.0)
    assert intensity.record(10.5)  # the one at 0.0 left the window
    assert not intensity.record(11.0)


def test_an_escalation_says_whose_restarts_spent_the_limit() -> None:
    """The limit counts every child together: the one that exits last may have
    restarted once (the message used to give it the whole count)."""
    intensity = RestartIntensity(max_restarts=3, max_seconds=10.0)
    for t, who in (
        (0.0, "old"),
        (11.0, "detokenizer"),
        (12.0, "detokenizer"),
        (13.0, "detokenizer"),
    ):
        assert intensity.record(t, who)
    assert not intensity.record(14.0, "tokenizer0")
    assert intensity.exceeded() == (
        "exited once too often: more than 3 restarts within 10 s, counting every actor of "
        "the supervisor (detokenizer 3, tokenizer0 1)"
    )


def test_zero_restarts_escalates_at_once() -> None:
    assert RestartIntensity(max_restarts=0, max_seconds=1.0).record(0.0) is False


def test_backoff_doubles_for_a_crash_loop_and_is_capped() -> None:
    backoff = Backoff(initial=0.1, maximum=0.5, reset_after=10.0)
    delays = [backoff.next_delay(ran_for=0.2) for _ in range(6)]
    assert delays == [0.0, 0.1, 0.2, 0.4, 0.5, 0.5]


def test_backoff_resets_after_a_long_run() -> None:
    backoff = Backoff(initial=0.1, maximum=5.0, reset_after=10.0)
    backoff.next_delay(0.0)
    assert backoff.next_delay(0.0) == 0.1
    assert backoff.next_delay(ran_for=60.0) == 0.0


def test_backoff_for_crashes_with_requests_in_hand_is_at_most_the_initial_delay() -> None:
    backoff = Backoff(initial=0.1, maximum=5.0, reset_after=10.0)
    delays = [backoff.next_delay(ran_for=0.2, with_requests=True) for _ in range(4)]
    assert delays == [0.0, 0.1, 0.1, 0.1]
    assert backoff.next_delay(ran_for=0.2) == 0.8  # they count in the crash streak


def _noop() -> None:
    pass


def test_spec_validation_names_the_problem() -> None:
    with pytest.raises(ConfigError, match="unique"):
        SupervisorSpec(children=(ActorSpec("a", _noop), ActorSpec("a", _noop)))
    with pytest.raises(ConfigError, match="ring name"):
        RingDecl("bad name")
    with pytest.raises(ConfigError, match="supervisor name"):
        SupervisorSpec(children=(), name="a/b")
    with pytest.raises(ValueError):
        SupervisorSpec(children=(), strategy="one_for_some")  # type: ignore[arg-type]


def test_tree_checks_need_the_whole_tree() -> None:
    # a subtree may use a ring its root declares: checked when the root is built
    sub = SupervisorSpec(children=(ActorSpec("a", _noop, inboxes=("r",)),), name="sub")
    root = SupervisorSpec(children=(sub,), rings=(RingDecl("r"),))
    root.check_tree()
    assert [a.name for a in root.actors()] == ["a"]
    assert [s.name for s in root.supervisors()] == ["root", "sub"]
    with pytest.raises(ConfigError, match="not a declared ring"):
        sub.check_tree()
    with pytest.raises(ConfigError, match="single-producer single-consumer"):
        SupervisorSpec(
            children=(ActorSpec("a", _noop, inboxes=("r",)), ActorSpec("b", _noop, inboxes=("r",))),
            rings=(RingDecl("r"),),
        ).check_tree()
    with pytest.raises(ConfigError, match="unique across the supervision tree"):
        SupervisorSpec(children=(ActorSpec("x", _noop), sub), name="a").check_tree()

"""Fault plans: loading (TOML, JSON, env), validation, and the seeded injector."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from rt.actors import Actor, ActorSpec, FaultKind, FaultPlan, FaultRule, Faults, Supervisor, Verdict
from rt.actors.faults import NO_FAULTS
from rt.actors.mailbox import corrupt
from rt.actors.spec import SupervisorSpec
from rt.errors import ConfigError, FaultInjected

TOML_PLAN = """
seed = 7
[[faults]]
actor = "tok*"
point = "receive"
action = "sigkill"
after = 3
incarnation = 1

[[faults]]
point = "send"
action = "delay"
delay_ms = 5
probability = 0.5
times = 0
"""


def test_load_toml(tmp_path: Path) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(TOML_PLAN)
    plan = FaultPlan.load(path)
    assert plan.seed == 7
    assert plan.rules[0] == FaultRule(
        point="receive", action=FaultKind.SIGKILL, actor="tok*", after=3, incarnation=1
    )
    assert plan.rules[1].action is FaultKind.DELAY and plan.rules[1].times == 0
    assert [i for i, _ in plan.for_actor("tok0", 1)] == [0, 1]
    assert [i for i, _ in plan.for_actor("tok0", 2)] == [1]
    assert [i for i, _ in plan.for_actor("sched", 1)] == [1]


def test_from_env_json_text_and_path(tmp_path: Path) -> None:
    text = '{"seed": 3, "faults": [{"point": "loop", "action": "exit", "exit_code": 9}]}'
    plan = FaultPlan.from_env({"RT_FAULT_PLAN": text})
    assert plan is not None and plan.seed == 3 and plan.rules[0].exit_code == 9
    path = tmp_path / "plan.json"
    path.write_text(text)
    assert FaultPlan.from_env({"RT_FAULT_PLAN": str(path)}) == plan
    assert FaultPlan.from_env({}) is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"faults": [{"point": "loop", "action": "explode"}]}, "unknown; expected one of"),
        ({"faults": [{"point": "loop", "action": "raise", "colour": 1}]}, "unknown keys"),
        ({"faults": [{"point": "loop", "action": "raise", "probability": 2}]}, "probability"),
        ({"faults": [{"point": "loop", "action": "hang", "hang": "nap"}]}, "hang must be"),
        ({"seeds": 1}, "unknown keys"),
        # what a JSON or TOML plan can hold: refused by name (a TypeError's traceback,
        # or taken: times 1e400 as infinity, a 1e308 ms delay that hangs for good)
        (5, "expected an object with seed and faults, got int"),
        ({"seed": "abc"}, "seed must be an integer"),
        ({"faults": {"point": "loop"}}, "faults must be a list"),
        ({"faults": [1]}, "rule 0: expected an object"),
        ({"faults": [{"point": ["loop"], "action": "raise"}]}, "rule 0: .*point must be a string"),
        ({"faults": [{"point": "loop", "action": "raise", "actor": 5}]}, "actor must be a string"),
        ({"faults": [{"point": "loop", "action": "raise", "times": 1e400}]}, "times must be an"),
        ({"faults": [{"point": "loop", "action": "raise", "after": 1.5}]}, "after must be an"),
        ({"faults": [{"point": "loop", "action": "raise", "match": 5}]}, "match must be a str"),
        ({"faults": [{"point": "loop", "action": "delay", "delay_ms": 1e308}]}, "delay_ms must"),
        ({"faults": [{"point": "loop", "action": "delay", "delay_ms": float("nan")}]}, "delay_ms"),
        ({"faults": [{"point": "loop", "action": "raise", "incarnation": -3}]}, "counts from 1"),
        ({"faults": [{"point": "loop", "action": "raise", "max_incarnation": 0}]}, "counts"),
    ],
)
def test_bad_plans_are_refused_with_the_reason(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FaultPlan.from_dict(data)


def test_whole_numbers_written_as_floats_or_a_seed_as_digits_are_taken() -> None:
    """As they were before the fields' types were checked (TOML's ``after = 3.0``)."""
    rule = {"point": "loop", "action": "raise", "after": 3.0, "times": 1.0, "incarnation": 2.0}
    plan = FaultPlan.from_dict({"seed": 7.0, "faults": [rule]})
    assert plan.seed == 7 and type(plan.seed) is int
    (got,) = plan.rules
    assert (got.after, got.times, got.incarnation) == (3, 1, 2) and type(got.after) is int
    assert FaultPlan.from_dict({"seed": "7"}).seed == 7
    with pytest.raises(ConfigError, match="after must be an integer, got '3'"):
        FaultPlan.from_dict({"faults": [{**rule, "after": "3"}]})
    for seed in ("--3", "²", "3.5"):  # (int() of the first two raised a ValueError)
        with pytest.raises(ConfigError, match="seed must be an integer"):
            FaultPlan.from_dict({"seed": seed})
    for code in (256, 10**300, -1):  # (256 exits 0; 1e300 overflowed os._exit)
        with pytest.raises(ConfigError, match=r"exit_code must be in \[0, 255\]"):
            FaultPlan.from_dict({"faults": [{**rule, "action": "exit", "exit_code": code}]})


def test_bad_text_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not valid json"):
        FaultPlan.parse("{nope")


class _Stepper(Actor):
    fault_points = frozenset({"step"})


def test_supervisor_refuses_a_point_no_actor_passes() -> None:
    spec = SupervisorSpec(children=(ActorSpec("sched", _Stepper),))
    Supervisor(
        spec, fault_plan=FaultPlan.from_dict({"faults": [{"point": "step", "action": "raise"}]})
    )
    typo = FaultPlan.from_dict({"faults": [{"point": "stpe", "action": "raise", "actor": "s*"}]})
    with pytest.raises(ConfigError, match="passes point 'stpe'"):
        Supervisor(spec, fault_plan=typo)
    nobody = FaultPlan.from_dict({"faults": [{"point": "step", "action": "raise", "actor": "x*"}]})
    with pytest.raises(ConfigError, match=r"no actor matches 'x\*'; the actors: \['sched'\]"):
        Supervisor(spec, fault_plan=nobody)  # (it was taken, and never fired)


def _fired(plan: FaultPlan, actor: str = "a", incarnation: int = 1, hits: int = 300) -> list[int]:
    faults = Faults(plan, actor, incarnation)
    return [hit for hit in range(hits) if faults.check("receive") is not Verdict.PASS]


def test_same_seed_same_faults_other_seed_other_faults() -> None:
    def plan(seed: int) -> FaultPlan:
        rule = {"point": "receive", "action": "drop", "probability": 0.2, "times": 0}
        return FaultPlan.from_dict({"seed": seed, "faults": [rule]})

    first = _fired(plan(1))
    assert first == _fired(plan(1))
    assert 20 < len(first) < 100
    assert first != _fired(plan(2))
    assert first != _fired(plan(1), incarnation=2)  # each incarnation has its own stream
    assert first != _fired(plan(1), actor="b")


def test_after_times_and_incarnation_filters() -> None:
    plan = FaultPlan(
        (FaultRule("receive", FaultKind.DUPLICATE, after=2, times=2, max_incarnation=2),)
    )
    assert _fired(plan, incarnation=1, hits=10) == [2, 3]
    assert _fired(plan, incarnation=2, hits=10) == [2, 3]
    assert _fired(plan, incarnation=3, hits=10) == []
    faults = Faults(plan, "a", 1)
    for _ in range(3):
        faults.check("receive")
    assert [(f.point, f.hit, f.action) for f in faults.fired] == [
        ("receive", 3, FaultKind.DUPLICATE)
    ]


def test_verdict_actions() -> None:
    for kind, verdict in [
        ("drop", Verdict.DROP),
        ("duplicate", Verdict.DUPLICATE),
        ("corrupt", Verdict.CORRUPT),
    ]:
        faults = Faults(FaultPlan((FaultRule("send", FaultKind(kind)),)), "a")
        assert faults.check("send") is verdict
        assert faults.check("send") is Verdict.PASS  # times = 1
        assert faults.check("receive") is Verdict.PASS


def test_raise_and_oom_actions() -> None:
    faults = Faults(
        FaultPlan((FaultRule("step", FaultKind.RAISE), FaultRule("step", FaultKind.OOM, after=1))),
        "a",
    )
    with pytest.raises(FaultInjected, match="raise at point 'step' of actor 'a'"):
        faults.check("step")
    with pytest.raises(MemoryError, match="oom at point 'step'"):
        faults.check("step")


def test_sync_delay_blocks_the_thread() -> None:
    faults = Faults(FaultPlan((FaultRule("step", FaultKind.DELAY, delay_ms=30),)), "a")
    start = time.perf_counter()
    assert faults.check("step") is Verdict.PASS
    assert time.perf_counter() - start >= 0.03


async def test_async_delay_sleeps_in_trio(autojump_clock: trio.testing.MockClock) -> None:
    faults = Faults(FaultPlan((FaultRule("step", FaultKind.DELAY, delay_ms=2500),)), "a")
    start = trio.current_time()
    assert await faults.point("step") is Verdict.PASS
    assert trio.current_time() - start == pytest.approx(2.5)


async def test_no_plan_is_a_pass() -> None:
    assert not NO_FAULTS
    assert NO_FAULTS.check("receive") is Verdict.PASS
    assert await NO_FAULTS.point("receive") is Verdict.PASS


def test_corrupt_inverts_the_middle_byte_of_a_copy() -> None:
    data = bytearray(b"abcde")
    assert corrupt(data) == bytearray(b"ab\x9cde") and data == b"abcde"
    assert corrupt([b"ab", memoryview(b"cde")]) == bytearray(b"ab\x9cde")
    assert corrupt(b"") == bytearray()


def test_the_supervisor_reads_rt_fault_plan_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = SupervisorSpec(children=(ActorSpec("sched", _Stepper),))
    monkeypatch.delenv("RT_FAULT_PLAN", raising=False)
    assert Supervisor(spec).fault_plan is None
    monkeypatch.setenv(
        "RT_FAULT_PLAN", '{"seed": 5, "faults": [{"point": "step", "action": "exit"}]}'
    )
    plan = Supervisor(spec).fault_plan
    assert plan is not None and plan.seed == 5 and plan.rules[0].action is FaultKind.EXIT


def test_match_fires_only_at_hits_whose_key_contains_it() -> None:
    rule = FaultRule("tokenize", FaultKind.DROP, match="POISON", after=1, times=0)
    faults = Faults(FaultPlan((rule,)), "tok0")
    keys = ["hello", "POISON 1", None, "a POISON b", "POISON 3", "bye"]
    verdicts = [faults.check("tokenize", key=k) for k in keys]
    # the first matching hit passes (after = 1), every later matching one fires
    assert verdicts == [Verdict.PASS, Verdict.PASS, Verdict.PASS, Verdict.DROP, Verdict.DROP,
                        Verdict.PASS]  # fmt: skip
    assert [f.hit for f in faults.fired] == [2, 3]


def test_keyed_says_whether_a_rule_at_the_point_looks_for_a_key() -> None:
    plan = FaultPlan(
        (
            FaultRule("forward", FaultKind.EXIT, match=" 5 5 ", times=0),
            FaultRule("step", FaultKind.DROP),
        )
    )
    faults = Faults(plan, "scheduler")
    assert faults.keyed("forward") and not faults.keyed("step") and not faults.keyed("send")
    assert not Faults().keyed("forward")

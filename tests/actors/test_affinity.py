"""Pinning actors to CPUs: the CPU lists, the engine's split, and real children
pinned at every start, a restart's included."""

from __future__ import annotations

import os
import re
import signal

import pytest
import trio
from sample_actors import Idle
from supervision_lib import TIMEOUT, is_running, quick_spec, wait_until

from rt.actors import ActorSpec, Supervisor, open_supervisor
from rt.actors.affinity import format_cpu_list, parse_cpu_list, split_cpus
from rt.config import EngineOptions
from rt.errors import ConfigError, EscalationError

ALLOWED = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 CPUs to pin apart")


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0", (0,)), ("3", (3,)), ("0-2,5", (0, 1, 2, 5)), (" 4 , 1-2", (1, 2, 4)), ("2,2", (2,))],
)
def test_a_cpu_list_reads_as_taskset_writes_it(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == cpus
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "numbers and ranges"),
        ("one", "numbers and ranges"),
        ("1-", "numbers and ranges"),
        ("3-1", "0 <= low <= high"),
        ("-1", "numbers and ranges"),
        ("0,,1", "numbers and ranges"),
    ],
)
def test_a_bad_cpu_list_is_refused_with_what_was_expected(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_cpu_list(text)


def test_format_cpu_list_folds_runs_into_ranges() -> None:
    assert format_cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


@two_cpus
def test_the_scheduler_gets_the_cpus_named_and_the_others_the_rest() -> None:
    mine, rest = split_cpus(str(ALLOWED[-1]))
    assert mine == (ALLOWED[-1],) and rest == tuple(ALLOWED[:-1])


def test_a_split_must_stay_within_the_allowed_cpus_and_leave_some_for_the_others() -> None:
    outside = ALLOWED[-1] + 1000
    with pytest.raises(ConfigError, match=f"CPU {outside} is not one this process may run on"):
        split_cpus(f"{ALLOWED[0]},{outside}")
    with pytest.raises(ConfigError, match="leave at least one"):
        split_cpus(format_cpu_list(ALLOWED))


def test_engine_options_check_the_list_and_thread_the_scheduler_over_it() -> None:
    with pytest.raises(ConfigError, match="scheduler_cpus"):
        EngineOptions.build(scheduler_cpus="1-x")
    assert EngineOptions.build(scheduler_cpus="2-4,7").engine_config().torch_threads == 4
    explicit = EngineOptions.build(scheduler_cpus="2-4", torch_threads=1)
    assert explicit.engine_config().torch_threads == 1
    assert EngineOptions.build().engine_config().torch_threads is None


@two_cpus
async def test_a_pinned_child_is_pinned_again_when_it_restarts() -> None:
    last = ALLOWED[-1]
    spec = quick_spec(ActorSpec("pinned", Idle, cpus=(last,)), ActorSpec("free", Idle))
    async with open_supervisor(spec) as sup:
        status = sup.status()
        pid = status.actor("pinned").pid
        assert pid is not None
        assert os.sched_getaffinity(pid) == {last}
        assert os.sched_getaffinity(status.actor("free").pid) == set(ALLOWED)  # type: ignore[arg-type]
        os.kill(pid, signal.SIGKILL)
        status = await wait_until(sup, is_running("pinned", 2))
        again = status.actor("pinned").pid
        assert again is not None and again != pid
        assert os.sched_getaffinity(again) == {last}


async def test_a_cpu_that_cannot_be_had_is_a_start_up_failure_not_a_crash() -> None:
    nowhere = ALLOWED[-1] + 4096
    sup = Supervisor(quick_spec(ActorSpec("nowhere", Idle, cpus=(nowhere,)), max_restarts=0))
    with pytest.raises(EscalationError) as caught:
        with trio.fail_after(TIMEOUT):
            await sup.run()
    assert re.search(
        rf"startup failed: actor 'nowhere' \(pid \d+\): cannot pin it to CPUs {nowhere}",
        str(caught.value),
    )


def test_an_actor_spec_refuses_a_cpu_that_is_not_a_number() -> None:
    with pytest.raises(ConfigError, match="cpus must be CPU numbers"):
        ActorSpec("bad", Idle, cpus=())
    with pytest.raises(ConfigError, match="cpus must be CPU numbers"):
        ActorSpec("bad", Idle, cpus=(-1,))

"""Supervisor latencies: SIGKILL an idle actor N times and time its recovery.

    python tools/bench_supervisor.py --kills 100 [--json]

detection: SIGKILL sent -> the supervisor has seen the exit (pidfd readable)
restore:   SIGKILL sent -> the restarted child has reported ready

Also times a fault-injection point with no plan, and with a plan that has no
rule for the point (the cost every actor pays on every receive and send).
Targets: detection p99 < 10 ms, restore p99 < 1 s.

``--pipeline K`` instead SIGKILLs each of ``rt.open_engine``'s actors (the
shipped model) K times, one kill at a time, idle, and times for each actor:

restore: SIGKILL sent -> the successor has reported ready (it has imported what it
         needs and loaded its tokenizer or model)
served:  SIGKILL sent -> a request sent right after the kill has completed

Kills come ~a restore apart, so all but an actor's first restart wait the
supervisor's initial backoff (50 ms) first; it is in the figures.

    python tools/bench_supervisor.py --pipeline 5 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rt.actors import (
    Actor,
    ActorContext,
    ActorSpec,
    ActorState,
    FaultKind,
    FaultPlan,
    FaultRule,
    Faults,
    SupervisorSpec,
    SupervisorStatus,
    open_supervisor,
)
from rt.chaos.cli import at_least


class IdleActor(Actor):
    """Imports nothing: its restore time is the interpreter, trio and rt.actors."""

    async def run(self, ctx: ActorContext) -> None:
        await trio.sleep_forever()


def _restarted(status: SupervisorStatus, incarnation: int) -> bool:
    actor = status.actor("idle")
    return actor.incarnation == incarnation and actor.state is ActorState.RUNNING


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        "p50_ms": round(percentile(ms, 50), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "max_ms": round(max(ms), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


async def measure_kills(kills: int) -> tuple[list[float], list[float]]:
    spec = SupervisorSpec(
        children=(ActorSpec("idle", IdleActor),),
        max_restarts=kills + 1,
        backoff_initial=0.0,  # measure the restart path itself, not the backoff policy
    )
    detection, restore = [], []
    async with open_supervisor(spec) as sup:
        for i in range(kills):
            actor = sup.status().actor("idle")
            assert actor.pid is not None and actor.incarnation == i + 1
            await trio.sleep(0.02)  # let the child settle into its idle wait
            killed_at = time.monotonic()
            os.kill(actor.pid, signal.SIGKILL)
            with trio.fail_after(30):
                after = await sup.wait_for(partial(_restarted, incarnation=i + 2))
            done = after.actor("idle")
            assert done.last_exit_at is not None and done.ready_at is not None
            detection.append(done.last_exit_at - killed_at)
            restore.append(done.ready_at - killed_at)
    return detection, restore


def time_points(calls: int = 200_000, repeats: int = 5) -> dict[str, float]:
    """ns per call of a fault point that does not fire (best of ``repeats``: the
    machine is shared, and the minimum is the cost without interference)."""
    other = FaultPlan((FaultRule("step", FaultKind.RAISE, actor="someone-else"),))
    unrelated = FaultPlan((FaultRule("step", FaultKind.RAISE, actor="a"),))
    loop = range(calls)

    def sync_ns(faults: Faults) -> float:
        check = faults.check
        start = time.perf_counter_ns()
        for _ in loop:
            check("receive")
        return (time.perf_counter_ns() - start) / calls

    async def async_ns(faults: Faults) -> float:
        point = faults.point
        start = time.perf_counter_ns()
        for _ in loop:
            await point("receive")
        return (time.perf_counter_ns() - start) / calls

    def empty_ns() -> float:
        start = time.perf_counter_ns()
        for _ in loop:
            pass
        return (time.perf_counter_ns() - start) / calls

    results = {"empty_loop_ns": round(min(empty_ns() for _ in range(repeats)), 1)}
    for label, faults in (
        ("no_plan", Faults()),
        ("plan_for_other_actors", Faults(other, "a")),
        ("plan_without_this_point", Faults(unrelated, "a")),
    ):
        best = min(sync_ns(faults) for _ in range(repeats))
        results[f"check_{label}_ns"] = round(best, 1)
        best = min(trio.run(async_ns, faults) for _ in range(repeats))
        results[f"await_point_{label}_ns"] = round(best, 1)
    return results


PIPELINE_ACTORS = ("tokenizer0", "detokenizer", "scheduler")


def _successor_ready(status: SupervisorStatus, name: str, killed: int, at: float) -> bool:
    """Whether an incarnation after ``killed``, killed at ``at``, is ready (``ready_at``
    stays the killed one's until the successor's is set)."""
    actor = status.actor(name)
    ready = actor.ready_at is not None and actor.ready_at > at
    return actor.incarnation > killed and ready


async def measure_pipeline(kills: int) -> dict[str, dict[str, list[float]]]:
    import rt

    out: dict[str, dict[str, list[float]]] = {}
    async with rt.open_engine(max_restarts=3 * kills + 3, torch_threads=1) as engine:
        sup = engine.supervisor
        await engine.generate("warm up", max_new_tokens=2)
        for name in PIPELINE_ACTORS:
            restore, served = [], []
            for _ in range(kills):
                before = sup.status().actor(name)
                assert before.pid is not None
                killed_at = time.monotonic()
                os.kill(before.pid, signal.SIGKILL)
                await engine.generate("after a kill", max_new_tokens=2)
                served.append(time.monotonic() - killed_at)
                with trio.fail_after(60):
                    ready = partial(
                        _successor_ready, name=name, killed=before.incarnation, at=killed_at
                    )
                    ready_at = (await sup.wait_for(ready)).actor(name).ready_at
                assert ready_at is not None
                restore.append(ready_at - killed_at)
            out[name] = {"restore": restore, "served": served}
    return out


def main_pipeline(kills: int, as_json: bool) -> int:
    measured = trio.run(measure_pipeline, kills)
    result = {
        name: {k: summary(v) for k, v in figures.items()} for name, figures in measured.items()
    }
    if as_json:
        print(json.dumps({"kills_per_actor": kills, "cpus": os.cpu_count(), "actors": result}))
        return 0
    print(f"{kills} SIGKILLs of each pipeline actor, idle ({os.cpu_count()} cpus)")
    for name, figures in result.items():
        for what, s in figures.items():
            print(
                f"  {name:12} {what:8} p50 {s['p50_ms']:8.1f} ms  p99 {s['p99_ms']:8.1f} ms  "
                f"max {s['max_ms']:8.1f} ms"
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=at_least(1), default=100)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--pipeline", type=int, metavar="K", help="kill each of rt's pipeline actors K times"
    )
    args = parser.parse_args(argv)
    if args.pipeline is not None:
        if args.pipeline < 1:
            parser.error(f"--pipeline: expected 1 or more kills, got {args.pipeline}")
        return main_pipeline(args.pipeline, args.json)
    detection, restore = trio.run(measure_kills, args.kills)
    result = {
        "kills": args.kills,
        "cpus": os.cpu_count(),
        "detection": summary(detection),
        "restore": summary(restore),
        "fault_points": time_points(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.kills} SIGKILLs of an idle actor ({os.cpu_count()} cpus)")
        for name in ("detection", "restore"):
            s = result[name]
            print(
                f"  {name:9}  p50 {s['p50_ms']:8.2f} ms  p99 {s['p99_ms']:8.2f} ms  "
                f"max {s['max_ms']:8.2f} ms"
            )
        for name, ns in result["fault_points"].items():
            print(f"  {name:42} {ns:6.1f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""tools/bench_supervisor.py: the supervisor's own latencies, and --pipeline's
restarts of rt's actors, each timed until a request after the kill is served."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_supervisor.py"


def run(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, str(TOOL), *args, "--json"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_it_times_detection_and_restore_of_an_idle_actor() -> None:
    figures = run("--kills", "3")
    assert figures["kills"] == 3
    assert 0 < figures["detection"]["p50_ms"] <= figures["restore"]["p50_ms"]
    assert figures["fault_points"]["check_no_plan_ns"] > 0


@pytest.mark.slow
def test_pipeline_kills_each_actor_and_a_request_is_served_after_every_kill() -> None:
    figures = run("--pipeline", "1")
    assert figures["kills_per_actor"] == 1
    assert set(figures["actors"]) == {"tokenizer0", "detokenizer", "scheduler"}
    for name, actor in figures["actors"].items():
        # every request passes through every actor: the one sent right after the
        # kill completes through the successor, once it is ready
        restore, served = actor["restore"]["p50_ms"], actor["served"]["p50_ms"]
        assert 0 < restore <= served, f"{name}: ready {restore} ms, served {served} ms"


def test_pipeline_refuses_a_count_below_one() -> None:
    out = subprocess.run(
        [sys.executable, str(TOOL), "--pipeline", "0"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "--pipeline: expected 1 or more kills, got 0" in out.stderr

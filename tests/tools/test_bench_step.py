"""tools/bench_step.py runs the engine core and reports a step's parts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_step.py"


def test_it_reports_a_step_and_its_parts_for_a_batch(tiny_model: Path) -> None:
    args = ["--model-path", str(tiny_model), "--batch", "3", "--steps", "5", "--json"]
    out = subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["batch"] == 3 and figures["dtype"] == "float32"
    parts = figures["build_ms"] + figures["forward_ms"] + figures["sample_ms"]
    assert parts > 0 and figures["step_ms"] > 0
    assert figures["tokens_per_s"] == pytest.approx(3 / (figures["step_ms"] / 1e3))

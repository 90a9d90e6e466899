"""tools/bench_ttft.py cuts each first token's time where the pipeline's clocks are."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_ttft.py"
PARTS = ("submit→admitted", "admitted→stepped", "stepped→front", "front→caller")


def test_it_reports_the_first_token_and_its_parts_on_one_clock() -> None:
    args = ["--requests", "6", "--warmup", "1", "--input-len", "20", "--json"]
    out = subprocess.run(
        [sys.executable, str(TOOL), *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["requests"] == 6 and result["input_len"] == 20
    # the parts come from clocks of three processes: all one clock, each part after the last
    for part in PARTS:
        assert 0 < result[part]["p50"] <= result[part]["p99"], (part, result[part])
    # a 20-token prefill of the default model: the step is a share of it, never all
    assert 0 < result["admitted→stepped"]["p50"] < result["ttft"]["p50"]

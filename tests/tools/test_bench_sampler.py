"""tools/bench_sampler.py times penalties and a logit bias against plain rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_sampler.py"


def test_it_reports_what_penalties_and_a_bias_add_by_prompt_length() -> None:
    args = ["--vocab", "64", "--batch", "2", "--prompt-lens", "10,40", "--rounds", "1"]
    out = subprocess.run(
        [sys.executable, str(TOOL), *args, "--steps", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [line["prompt_len"] for line in lines] == [10, 40]
    for line in lines:
        assert line["vocab"] == 64 and line["batch"] == 2
        assert all(line[f"{kind}_ms"] > 0 for kind in ("plain", "penalties", "bias", "both"))
        assert abs(line["both_adds_ms"] - (line["both_ms"] - line["plain_ms"])) < 0.002

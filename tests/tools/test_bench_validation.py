"""tools/bench_validation.py: what validating adversarial bodies costs, against a
valid body of the same size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_it_measures_every_case_and_each_bad_body_is_refused() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_validation.py"), "--mib", "0.5", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    cases = json.loads(out.stdout)["cases"]
    assert len(cases) == 11
    for name, row in cases.items():
        assert row["bytes"] > 0.4 * (1 << 20) and row["seconds"] > 0 and row["grew_mb"] >= 0
        taken = "valid" in name or "baseline" in name
        assert (row["said"] == "taken") == taken, (name, row["said"])
        assert taken or row["said"].startswith("400: "), (name, row["said"])

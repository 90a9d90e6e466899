"""tools/bench_ipc.py runs end to end and prints the JSON the issue specifies,
alone and beside busy processes. (Smoke runs: the figures themselves belong to
the benchmark, not to a test.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_ipc.py"


def test_the_ipc_benchmark_prints_every_transport_and_figure() -> None:
    out = subprocess.run(
        [sys.executable, str(TOOL), "--quick", "--rounds", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    results = json.loads(out.stdout)
    assert set(results) == {"small", "large"}
    for payload, by_transport in results.items():
        assert set(by_transport) == {"rt", "zmq", "zmq_rt_codec", "mp_queue", "rt_batched"}
        for name, figures in by_transport.items():
            assert figures["msgs_per_s"] > 0, (payload, name)
            if name != "rt_batched":
                assert 0 < figures["rtt_p50_us"] <= figures["rtt_p99_us"], (payload, name)


def test_the_contended_comparison_reports_a_quiet_and_a_contended_table() -> None:
    """With both endpoints of each transport held on one CPU (--placement same)."""
    flags = ["--quick", "--rounds", "1", "--contend", "1", "--contend-limit", "120"]
    flags += ["--placement", "same"]
    out = subprocess.run(
        [sys.executable, str(TOOL), *flags, "--transports", "rt,zmq", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    results = json.loads(out.stdout)
    assert set(results) == {"busy_processes", "placement", "quiet", "contended"}
    assert (results["busy_processes"], results["placement"]) == (1, "same")
    for table in ("quiet", "contended"):
        for payload, by_transport in results[table].items():
            assert set(by_transport) == {"rt", "zmq", "rt_batched"}, (table, payload)
            for name in ("rt", "zmq"):
                figures = by_transport[name]
                assert 0 < figures["rtt_p50_us"] <= figures["rtt_p99_us"], (table, payload, name)

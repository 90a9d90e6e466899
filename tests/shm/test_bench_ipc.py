"""tools/bench_ipc.py runs end to end and prints the JSON the issue specifies.
(A smoke run: the figures themselves belong to the benchmark, not to a test.)"""

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

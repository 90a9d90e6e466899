"""A client whose host vanished (no FIN, no RST) while its answer, not
streamed, was being made: the kernel's keepalive probes (``--tcp-keepalive``)
find it gone, and its request is aborted. Before, nothing was ever sent on
such a connection until the answer was done: the request generated to its
end, and the connection stayed open for good.

The client vanishes in a network namespace of the test's own
(``unshare -rn``), where the loopback is taken down under it:
``vanished_client.py``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from serverlib import write_plan


def _namespaces() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = ["unshare", "-rn", "ip", "link", "set", "lo", "up"]
    return subprocess.run(probe, capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces(), reason="no unprivileged network namespace")

SCRIPT = Path(__file__).with_name("vanished_client.py")
SLOW = {  # 400 tokens in ~40 s: still generating when the client vanishes
    "seed": 1,
    "faults": [
        {"actor": "scheduler", "point": "step", "action": "delay", "delay_ms": 100, "times": 0}
    ],
}


@pytest.mark.parametrize("keepalive_s, held", [(1, 0), (0, 1)])
def test_a_client_whose_host_vanished_is_found_gone_and_its_request_aborted(
    tmp_path: Path, keepalive_s: int, held: int
) -> None:
    """(``--tcp-keepalive=0``, no probes: the request is still held, as before.)"""
    plan = write_plan(tmp_path / "slow.json", SLOW)
    run = subprocess.run(
        ["unshare", "-rn", sys.executable, str(SCRIPT), str(keepalive_s), plan],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": f"{SCRIPT.parent}:{SCRIPT.parent.parent}"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.splitlines()[-1]) == {"held": held}

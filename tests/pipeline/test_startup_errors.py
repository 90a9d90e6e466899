"""What ``rt.open_engine`` raises when it cannot start: the error itself, which
``except rt.errors.EscalationError`` (or ``except KeyboardInterrupt``) catches,
not a group of trio's holding it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import rt

ROOT = Path(rt.__file__).resolve().parent.parent
NULL: dict[str, object] = dict(device="cpu", load_format="null", torch_threads=1)


def plan(tmp_path: Path, **rule: object) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"seed": 1, "faults": [{"actor": "tokenizer0", **rule}]}))
    return str(path)


def children_of(pid: int) -> list[str]:
    found = subprocess.run(["pgrep", "-f", f"--parent {pid}"], capture_output=True, text=True)
    return found.stdout.split()


@pytest.mark.skipif(
    "torch" in sys.modules and sys.modules["torch"].cuda.is_available(), reason="a GPU is here"
)
async def test_cuda_asked_for_on_a_host_without_it_is_a_config_error_before_anything_starts() -> (
    None
):
    start = time.monotonic()
    with pytest.raises(rt.errors.ConfigError, match="torch sees 0 CUDA device"):
        async with rt.open_engine(**{**NULL, "device": "cuda"}):
            pass
    assert time.monotonic() - start < 30  # (it was an escalation after the scheduler's start)
    assert not children_of(os.getpid())


async def test_an_actor_that_cannot_start_escalates_as_an_escalation_error(tmp_path: Path) -> None:
    faults = plan(tmp_path, point="startup", action="raise")
    with pytest.raises(rt.errors.EscalationError, match="tokenizer0") as raised:
        async with rt.open_engine(**NULL, fault_plan=faults, max_restarts=1):
            pytest.fail("the engine started with a tokenizer that cannot")
    assert "startup failed" in str(raised.value)


@pytest.mark.slow
def test_ctrl_c_during_start_up_is_a_keyboard_interrupt(tmp_path: Path) -> None:
    """A script's Ctrl-C while the actors start ends it as Python ends any script
    on Ctrl-C (killed by SIGINT, "KeyboardInterrupt" last), with nothing left."""
    script = tmp_path / "start.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import signal, sys, trio, rt
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's
            async def main():
                async with rt.open_engine(**{NULL!r}, fault_plan=sys.argv[1]):
                    print("started", flush=True)
            trio.run(main)
            """
        )
    )
    faults = plan(tmp_path, point="startup", action="hang", hang="sleep")
    proc = subprocess.Popen(
        [sys.executable, str(script), faults],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # the tokenizer hangs in its start-up: the engine is starting
            seen.append(line)
            if "hang at point 'startup'" in line:
                break
        else:
            pytest.fail("the fault never fired:\n" + "".join(seen))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGINT, err
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    assert "ExceptionGroup" not in err and "started" not in out
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"rt_{proc.pid}_")]
    assert not children_of(proc.pid)

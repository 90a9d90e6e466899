"""``rt.actors.status.seen_down``: what /health asks of each running actor's process
(the kernel's word, before the supervisor has seen the exit)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time

from rt.actors.status import seen_down


def soon(pid: int, want: str) -> str | None:
    """What ``seen_down`` says within 1 s: a read may fall in the microseconds
    between the process taking the signal off its pending set and its new state
    (a stop came out None once in a full run)."""
    deadline = time.monotonic() + 1.0
    while (said := seen_down(pid)) != want and time.monotonic() < deadline:
        time.sleep(0.001)
    return said


def test_down_from_the_signal_on_not_only_once_reaped() -> None:
    # (a process holding memory: its threads take a while to go after the SIGKILL)
    code = "import time; x = bytearray(400 << 20); print(1, flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline()
        assert seen_down(child.pid) is None
        child.send_signal(signal.SIGSTOP)
        assert soon(child.pid, "stopped") == "stopped"  # at once, not after its silence
        child.send_signal(signal.SIGKILL)
        assert soon(child.pid, "exiting") == "exiting"  # at once: pending, or a zombie main thread
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert seen_down(child.pid) == "exiting"  # reaped (its pid not reused this soon)


def test_a_proc_it_cannot_read_is_no_kill() -> None:
    """Out of file descriptors, every actor read as killed: /health said 503
    "… is exiting" for each while the server was flooded with connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        try:
            while True:
                held.append(open("/dev/null"))  # noqa: SIM115
        except OSError:
            pass
        assert seen_down(os.getpid()) is None
    finally:
        for f in held:
            f.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

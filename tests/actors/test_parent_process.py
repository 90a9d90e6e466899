"""A supervisor as a process's main: SIGTERM, escalation, and being SIGKILLed."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from rt.actors import ActorSpec, Supervisor, SupervisorSpec
from rt.shm.segment import Segment, list_segments

SCRIPT = Path(__file__).with_name("supervisor_script.py")
PR_SET_CHILD_SUBREAPER = 36


@pytest.fixture
def subreaper() -> Iterator[None]:
    """Orphans of the killed script are re-parented to the test process (not to
    pid 1), so the test can wait for them and reap them."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    yield
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


async def _start_script(mode: str) -> tuple[trio.Process, dict]:
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(SCRIPT), mode], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    line = b""
    with trio.fail_after(20):
        while not line.endswith(b"\n"):
            chunk = await proc.stdout.receive_some()
            assert chunk, "the script exited before announcing its children"
            line += chunk
    await proc.stdout.aclose()
    return proc, json.loads(line)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_to_the_parent_stops_everything_and_exits_0(signum: int) -> None:
    proc, info = await _start_script("idle")
    assert len(list_segments(info["prefix"])) == 2  # heartbeats and ring "r"
    proc.send_signal(signum)
    with trio.fail_after(10):
        assert await proc.wait() == 0
    for pid in info["pids"]:
        assert not os.path.exists(f"/proc/{pid}")
    assert list_segments(info["prefix"]) == []


async def test_escalation_in_a_supervisor_main_exits_non_zero() -> None:
    with trio.fail_after(30):
        result = await trio.run_process(
            [sys.executable, str(SCRIPT), "escalate"],
            stdin=subprocess.DEVNULL,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 3
    stderr = result.stderr.decode()
    assert "rt: supervisor 'root': actor 'doomed' exited once too often: more than 1" in stderr
    assert "this actor cannot start: boom" in stderr


def _dead(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return not os.path.exists(f"/proc/{pid}")


async def _kill_and_wait_for_children(proc: trio.Process, info: dict) -> None:
    proc.kill()
    await proc.wait()
    killed_at = trio.current_time()
    children = set(info["pids"])
    while children:
        children = {pid for pid in children if not _dead(pid)}
        assert trio.current_time() - killed_at < 2.0, f"children {children} outlived their parent"
        await trio.sleep(0.01)


async def test_children_die_with_a_sigkilled_parent_and_its_reaper_unlinks_the_segments(
    subreaper: None,
) -> None:
    proc, info = await _start_script("idle")
    assert len(list_segments(info["prefix"])) == 2
    await _kill_and_wait_for_children(proc, info)
    with trio.fail_after(5):  # before, they stayed until another run's start-up swept
        while list_segments(info["prefix"]):
            await trio.sleep(0.01)
    # a side segment an actor made after that, before its parent-death signal: one
    # more look a second later
    late = Segment.create(info["prefix"] + "_r_x0_late", 64)
    late.close()
    with trio.fail_after(5):
        while list_segments(info["prefix"]) or not _dead(info["reaper"]):
            await trio.sleep(0.01)


async def test_the_next_start_sweeps_what_a_killed_parent_and_reaper_left(
    subreaper: None,
) -> None:
    proc, info = await _start_script("idle")
    left = list_segments(info["prefix"])
    assert len(left) == 2
    os.kill(info["reaper"], signal.SIGKILL)  # killed with it (the OOM killer, kill -9 -1):
    await _kill_and_wait_for_children(proc, info)  # (the parent had no time to start another)
    with trio.fail_after(5):
        while not _dead(info["reaper"]):  # the zombie, handed to this subreaper, is reaped
            await trio.sleep(0.01)
    assert list_segments(info["prefix"]) == left  # nobody was left to unlink them
    async with trio.open_nursery() as nursery:
        await nursery.start(Supervisor(SupervisorSpec(children=(ActorSpec("x", _noop_actor),))).run)
        assert list_segments(info["prefix"]) == []
        nursery.cancel_scope.cancel()


async def test_a_reaper_killed_alone_is_started_again(subreaper: None) -> None:
    """Killed before its run (by hand, by the OOM killer), the reaper was never
    replaced: the run went on, and once its root was killed its segments stayed."""
    proc, info = await _start_script("idle")
    os.kill(info["reaper"], signal.SIGKILL)
    with trio.fail_after(5):
        while _state(info["reaper"]) is not None:  # reaped by the parent, which starts another
            await trio.sleep(0.01)
    await trio.sleep(0.2)  # (its successor at its pipe)
    successors = _reapers_of(info["prefix"])
    assert len(successors) == 1
    await _kill_and_wait_for_children(proc, info)
    with trio.fail_after(5):
        while list_segments(info["prefix"]) or not _dead(successors[0]):
            await trio.sleep(0.01)


def _reapers_of(prefix: str) -> list[int]:
    """The reaper processes (rt/shm/reaper.py) of the run named ``prefix``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if f"{prefix}_".encode() in args:
            found.append(int(entry))
    return found


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _noop_actor() -> object:
    from sample_actors import Idle

    return Idle()


def test_a_child_whose_parent_is_already_gone_exits_at_once() -> None:
    # the re-check after arming PR_SET_PDEATHSIG: our parent is not pid 1
    code = "from rt.actors.child import arm_parent_death; arm_parent_death(1); print('alive')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False)
    assert result.returncode == 70 and result.stdout == b""

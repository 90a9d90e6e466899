"""Segment names and the start-up sweep: only provably dead runs of this pid
namespace and boot are ever unlinked (r14: a run in another namespace lost its
live segments to our sweep)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rt.shm import Ring, new_run_prefix, sweep
from rt.shm.segment import (
    NAME_RE,
    UNKNOWN_BOOT,
    RunIdentity,
    Segment,
    list_segments,
    run_is_dead,
    run_prefix,
    this_run_identity,
    unlink,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dead_pid() -> int:
    """A pid that existed in this namespace and is gone (reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.fixture
def made() -> Iterator[list[str]]:
    """Segments a test creates under other runs' names: unlinked whatever happens."""
    names: list[str] = []
    yield names
    for name in names:
        unlink(name)


def make(made: list[str], name: str) -> str:
    Segment.create(name, 64).close()
    made.append(name)
    return name


def test_a_run_prefix_names_its_root_pid_namespace_and_boot() -> None:
    me = this_run_identity()
    prefix = new_run_prefix()
    assert prefix.startswith(f"rt_{os.getpid()}_")  # tests/conftest.py's leak check relies on it
    match = NAME_RE.match(prefix + "_tag")
    assert match is not None
    assert match.group(2, 3) == (me.pid_ns, me.boot)
    assert int(me.pid_ns, 16) == os.stat("/proc/self/ns/pid").st_ino
    assert me.known


def test_only_a_dead_run_of_this_namespace_or_an_older_boot_is_dead(dead_pid: int) -> None:
    me = RunIdentity("effacade", "12345678")
    other_ns = RunIdentity("effacadf", me.boot)
    other_boot = RunIdentity(me.pid_ns, "87654321")
    assert run_is_dead(run_prefix(dead_pid, me, "00000001") + "_x", me)
    assert not run_is_dead(run_prefix(os.getpid(), me, "00000002") + "_x", me)
    assert not run_is_dead(run_prefix(dead_pid, other_ns, "00000003") + "_x", me)
    assert run_is_dead(run_prefix(os.getpid(), other_boot, "00000004") + "_x", me)
    unknown_boot = RunIdentity(me.pid_ns, UNKNOWN_BOOT)
    assert not run_is_dead(run_prefix(dead_pid, unknown_boot, "00000005") + "_x", me)
    assert not run_is_dead(f"rt_{dead_pid}_00000006_x", me), "an old-style name proves nothing"
    assert not run_is_dead(run_prefix(dead_pid, me, "00000007") + "_x", unknown_boot)


def test_the_sweep_leaves_other_namespaces_alone(dead_pid: int, made: list[str]) -> None:
    me = this_run_identity()
    foreign_ns = format(int(me.pid_ns, 16) + 1, "x")
    ours_dead = make(made, run_prefix(dead_pid, me, "0000000a") + "_hb")
    theirs = make(made, run_prefix(dead_pid, RunIdentity(foreign_ns, me.boot), "0000000b") + "_hb")
    old_boot = make(
        made, run_prefix(dead_pid, RunIdentity(foreign_ns, "0badb007"), "0000000c") + "_hb"
    )
    with Ring.create(new_run_prefix(), "live", capacity=4096) as live:
        removed = sweep()
        assert ours_dead in removed and old_boot in removed
        assert theirs not in removed and live.spec.name not in removed
        assert list_segments(live.spec.name) == [live.spec.name]
    assert list_segments(theirs) == [theirs]


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--pid", "--fork", "--mount-proc", "true"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    return False


CHILD = """
import json
from rt.shm.segment import Segment, run_prefix, sweep, this_run_identity
me = this_run_identity()
dead_here = run_prefix(999999, me, "0000dead") + "_hb"  # no such pid in this namespace
Segment.create(dead_here, 64).close()
print(json.dumps({"identity": list(me), "dead_here": dead_here, "removed": sweep()}))
"""


@pytest.mark.skipif(not _unshare_works(), reason="unshare --pid is unavailable or not permitted")
def test_a_run_in_another_pid_namespace_does_not_sweep_our_live_segments(
    dead_pid: int, made: list[str]
) -> None:
    # The method of ../shared/repro/r14_sweep_other_pidns.py: another run starts
    # in a pid namespace of its own, beside our live ring, and sweeps.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with Ring.create(new_run_prefix(), "live", capacity=4096) as live:
        out = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", CHILD],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=ROOT,
            check=True,
        )
        report = json.loads(out.stdout)
        made.append(report["dead_here"])
        assert live.spec.name not in report["removed"]
        assert list_segments(live.spec.name) == [live.spec.name], "our live ring was swept"
        assert report["dead_here"] in report["removed"], "it still sweeps its own dead runs"
        theirs = RunIdentity(*report["identity"])
        assert theirs.pid_ns != this_run_identity().pid_ns
        # And the other way: a run of theirs, dead-looking here, is not ours to sweep.
        their_run = make(made, run_prefix(dead_pid, theirs, "0000beef") + "_hb")
        assert their_run not in sweep()
        assert list_segments(their_run) == [their_run]

"""The leak check sees a child left running, a zombie, a segment and an fd."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rt.chaos import leaks


def test_nothing_left_is_nothing_found() -> None:
    before = leaks.snapshot()
    assert leaks.leaks(before, settle_s=0) == []


def test_children_zombies_segments_and_fds_are_found() -> None:
    before = leaks.snapshot()
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    while leaks.processes()[0].get(zombie.pid) != "Z":
        pass
    read, write = os.pipe()
    name = f"rt_{os.getpid()}_leaktest_x"
    open(f"/dev/shm/{name}", "w").close()
    try:
        found = "\n".join(leaks.leaks(before, settle_s=0))
        assert f"zombies (children never reaped): [{zombie.pid}]" in found
        assert f"child processes still running: [{running.pid}]" in found
        assert name in found
        assert "pipe:" in found
    finally:
        running.kill()
        running.wait()
        zombie.wait()
        os.close(read)
        os.close(write)
        os.unlink(f"/dev/shm/{name}")
    assert leaks.leaks(before, settle_s=0) == []


def start_grandchild() -> None:
    """A process of ours that is no child: its parent exits at once, so it is
    re-parented (it sleeps 30 s, carrying this process's tag)."""
    script = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'],"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def test_tagged_processes_that_are_not_our_children_are_orphans() -> None:
    tag = leaks.tag_environment()
    before = leaks.snapshot()
    start_grandchild()
    deadline = time.monotonic() + 5  # (once, on a loaded machine, the first look missed it)
    try:
        while True:
            found = leaks.leaks(before, tag=tag, settle_s=0)
            orphans = any(line.startswith("orphan processes still running") for line in found)
            if orphans or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert orphans, found
    finally:
        for pid in leaks.processes(tag)[1]:
            os.kill(pid, 9)


def test_tagged_processes_running_before_the_snapshot_are_no_orphans() -> None:
    """An rt-serve opened before no_leaks: its actors (grandchildren, tagged) were
    reported as orphans the body left."""
    tag = leaks.tag_environment()
    start_grandchild()
    try:
        deadline = time.monotonic() + 5
        while not leaks.processes(tag)[1]:  # (the grandchild is up)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        before = leaks.snapshot(tag=tag)
        assert leaks.leaks(before, tag=tag, settle_s=0) == []
    finally:
        for pid in leaks.processes(tag)[1]:
            os.kill(pid, 9)

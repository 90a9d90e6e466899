"""A process out of file descriptors (a front holding as many client
connections as ``ulimit -n`` allows): each ring operation that needs a new fd
waits for one or degrades, and nothing is lost or misread. Before, each raised
a bare OSError out of the ring, and the task that called it took the engine
down with it; a live peer was taken for dead for good."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, os, resource, time, trio
from rt.errors import ResourceExhausted, SegmentError
from rt.shm import Ring, RingReceiver, RingSender, new_run_prefix
from rt.shm.ring import PeerWatch
from rt.shm.segment import list_segments, unlink

MIB = 1 << 20
report = {}

def exhaust():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        return held

async def main():
    ring = Ring.create(new_run_prefix(), "t", capacity=1 << 16)
    tx, rx = RingSender.attach(ring.spec), RingReceiver.attach(ring.spec)
    child = await trio.lowlevel.open_process(["sleep", "30"])
    held = exhaust()
    # a live peer is alive, though no pidfd can be opened for it
    report["alive"] = PeerWatch().alive(child.pid)
    # a side frame's send waits for an fd, then goes
    start = time.monotonic()
    async def free_two_later():  # the segment's fd, and the dup its mapping takes
        await trio.sleep(0.3)
        os.close(held.pop())
        os.close(held.pop())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(free_two_later)
        await tx.send(b"a" * (3 * MIB))
    report["send_waited"] = time.monotonic() - start
    held += [os.open("/dev/null", os.O_RDONLY) for _ in range(2)]  # out of fds again
    # reading it: ResourceExhausted, the frame stays; once an fd is back, it is read
    try:
        rx.receive_data_nowait()
    except ResourceExhausted as err:
        report["receive"] = str(err)
    os.close(held.pop())
    os.close(held.pop())
    data = rx.receive_data_nowait()
    report["read"] = [bytes(data[:1]).decode(), len(data)]
    rx.commit()
    for fd in held:
        os.close(fd)
    # a side frame whose segment is gone is dropped: the next frame is read
    await tx.send(b"b" * (3 * MIB))
    await tx.send(b"after")
    for name in list_segments(ring.spec.name + "_x"):
        unlink(name)
    try:
        rx.receive_data_nowait()
    except SegmentError as err:
        report["lost"] = type(err).__name__
    report["next"] = bytes(rx.receive_data_nowait()).decode()
    rx.commit()
    child.kill()
    await child.wait()
    ring.close()

trio.run(main)
print(json.dumps(report))
"""


def test_ring_operations_wait_or_degrade_while_the_process_is_out_of_fds() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["alive"] is True  # before: False, and for good
    assert report["send_waited"] >= 0.25  # before: OSError
    assert "out of file descriptors" in report["receive"]  # before: a bare OSError
    assert report["read"] == ["a", 3 << 20]  # the frame stayed, and was read once fds came back
    assert report["lost"] == "SegmentError"
    assert report["next"] == "after"  # before: the same error again, the ring stuck there
    assert "waits for room" in out.stderr


PAST_1024 = """
import os, resource, subprocess, sys
from rt.shm.ring import PeerWatch

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))  # as rt-serve raises it
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
child = subprocess.Popen(["sleep", "30"])
watch = PeerWatch()
print(watch.alive(child.pid), watch.watch_fd(child.pid) > 1024)
child.kill()
child.wait()
print(watch.alive(child.pid))
"""


def test_a_peer_is_watched_through_an_fd_past_1024() -> None:
    # rt-serve raises its fd limit, and connections take the low fds: a pidfd past
    # 1024 made select.select raise ValueError, a 500 for every wait on that ring.
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 2048:
        pytest.skip("the hard limit of open files is below 2048")
    out = subprocess.run(
        [sys.executable, "-c", PAST_1024], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "False"]

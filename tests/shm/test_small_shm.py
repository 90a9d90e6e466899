"""A /dev/shm too small for what is sent (a container's 64 MiB): a segment
that does not fit is an error its creator handles, never a SIGBUS in whichever
process first writes to it, and a send waits for room as for a full ring."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import small_shm

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, time, trio
from rt.errors import SharedMemoryFull
from rt.shm import Ring, RingReceiver, RingSender, channel, new_run_prefix

MIB = 1 << 20
report = {}
try:
    Ring.create(new_run_prefix(), "huge", capacity=16 * MIB)
except SharedMemoryFull as err:
    report["ring"] = [err.fits_ever, str(err)]

async def main():
    ring = Ring.create(new_run_prefix(), "t", capacity=1 << 16)
    tx, rx = RingSender.attach(ring.spec), RingReceiver.attach(ring.spec)
    await tx.send(b"a" * (5 * MIB))  # a side segment: more than half the ring
    start = time.monotonic()
    async def commit_later():
        await trio.sleep(0.3)
        frame = await rx.receive()
        rx.commit(frame)  # unlinks the first side segment: room for the second
    async with trio.open_nursery() as nursery:
        nursery.start_soon(commit_later)
        await tx.send(b"b" * (5 * MIB))  # no room until then
    report["waited"] = time.monotonic() - start
    frame = await rx.receive()
    report["second"] = bytes(frame.data[:1]).decode(), len(frame.data)
    rx.commit(frame)
    try:
        await tx.send(b"c" * (12 * MIB))
    except SharedMemoryFull as err:
        report["never"] = [err.fits_ever, str(err)]
    # room held by a frame nobody commits: the send gives up after the ring's wait (the
    # receiver may be waiting on this very frame: a tokenizer holds its input until it
    # has sent its answer)
    channel.SHM_FULL_WAIT_S = 0.5
    await tx.send(b"d" * (5 * MIB))
    start = time.monotonic()
    try:
        await tx.send(b"e" * (5 * MIB))
    except SharedMemoryFull as err:
        report["gave_up"] = [err.fits_ever, time.monotonic() - start]
    ring.close()

trio.run(main)
print(json.dumps(report))
"""


@pytest.mark.skipif(not small_shm.available(), reason="unshare -m or mount is not permitted")
def test_a_send_waits_for_room_in_a_full_dev_shm_and_too_big_is_an_error() -> None:
    out = subprocess.run(
        small_shm.argv("8m", [sys.executable, "-c", CHILD]),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    # Before: the process died of SIGBUS (-7) at the first write past the tmpfs's room.
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    fits_ever, message = report["ring"]
    assert not fits_ever and "/dev/shm has no room for a segment of 16.0 MiB" in message
    assert "--shm-size" in message
    assert report["waited"] >= 0.25  # it waited for the receiver's commit, then went
    assert report["second"] == ["b", 5 << 20]
    fits_ever, message = report["never"]
    assert not fits_ever and "more than its 8.0 MiB hold beside this run's rings" in message
    assert "waits for room" in out.stderr  # the wait is said once, in the log
    fits_ever, waited = report["gave_up"]
    assert fits_ever and 0.5 <= waited < 5  # before: it waited for good

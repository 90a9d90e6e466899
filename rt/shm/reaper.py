"""The segments of a run whose root process was killed outright.

A root that exits, even by an exception, unlinks its run's segments; one
killed by SIGKILL (an orchestrator's grace period run out, the OOM killer)
cannot, and its actors die with it (their parent-death signal). Its
segments used to stay in /dev/shm, a tmpfs, so in memory, until the next
run's start-up :func:`~rt.shm.segment.sweep`: forever, if none came.

So the root starts a reaper for each run: a small process (Python without
``site``, no rt import: ~10 ms to start, ~8 MB) that blocks reading a pipe
whose write end only the root holds (non-inheritable, so no actor holds it
too). The pipe reaches end-of-file when the root closes it, having unlinked
everything itself, or when the kernel closes it for a root that died; either
way the reaper unlinks whatever is left under the run's prefix and exits. A
root that died said nothing first, so its actors may still be dying (their
parent-death signal comes after the root's fds are closed), one of them making
a side segment meanwhile: the reaper looks again a second later.
It leads a session of its own, so a terminal's ^C, meant for the root, does
not stop it before the root is done. The root's supervisor starts another
when it dies before its time (:func:`keep_reaping`): killed by hand or by the
OOM killer, it left a root killed later with its segments in /dev/shm.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys

import trio

from rt.shm.segment import SHM_DIR

log = logging.getLogger(__name__)

WAIT_S = 5.0  # for the reaper to finish once told: it has only a directory to list

_REAP = """
import os, sys, time
prefix, shm = sys.argv[1], sys.argv[2]
said = b""
while chunk := os.read(0, 64):
    said += chunk
def sweep():
    for name in os.listdir(shm):
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(shm, name))
            except OSError:
                pass
sweep()
if not said:  # the root died: an actor may make a side segment before its own death
    time.sleep(1.0)
    sweep()
"""


class Reaper:
    """Unlinks every segment named ``<prefix>_…`` once :meth:`close` is called
    or this process dies, whichever comes first."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._spawn()

    def _spawn(self) -> None:
        prefix = self._prefix
        read_end, self._write_end = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _REAP, f"{prefix}_", SHM_DIR],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            os.close(self._write_end)
            raise
        finally:
            os.close(read_end)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def respawn(self) -> int | None:
        """A reaper in place of this one, which died before it was told to sweep
        (killed: a dead one left a killed root's segments behind). Returns how the
        dead one exited (None: it had not, and is kept)."""
        status = self._proc.poll()  # (and the zombie reaped)
        if status is None or self._write_end < 0:
            return None
        os.close(self._write_end)
        self._spawn()
        return status

    def close(self) -> None:
        """Tell the reaper to sweep now (after the root unlinked what it could) and
        wait for it to exit."""
        if self._write_end < 0:
            return
        with contextlib.suppress(OSError):  # (a reaper killed: the pipe is broken)
            os.write(self._write_end, b"closed")  # no second look: the actors are stopped
        os.close(self._write_end)
        self._write_end = -1
        try:
            self._proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


async def keep_reaping(reaper: Reaper) -> None:
    """Start the reaper again each time it dies before it is told to sweep; until
    cancelled (the root's supervisor runs it, and closes the reaper after)."""
    while True:
        pidfd = os.pidfd_open(reaper.pid)
        try:
            await trio.lowlevel.wait_readable(pidfd)
        finally:
            os.close(pidfd)
        status = reaper.respawn()
        if status is not None:
            how = f"killed by signal {-status}" if status < 0 else f"exit code {status}"
            log.warning(
                "the reaper of this run's segments died (%s) before the run ended: "
                "started another, pid %d",
                how,
                reaper.pid,
            )

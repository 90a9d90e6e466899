"""Run a command with a /dev/shm of its own, as small as a container's (Docker
gives 64 MiB by default): a mount namespace with a fresh tmpfs over /dev/shm.
Needs ``unshare -m`` and the right to mount, as root has; tests skip without."""

from __future__ import annotations

import contextlib
import functools
import shlex
import shutil
import subprocess


def argv(size: str, command: list[str]) -> list[str]:
    """``command`` under a /dev/shm of ``size`` (a mount option: ``2m``)."""
    mount = f"mount -t tmpfs -o size={size} tmpfs /dev/shm"
    return ["unshare", "-m", "sh", "-c", f"{mount} && exec {shlex.join(command)}"]


@functools.cache
def available() -> bool:
    if shutil.which("unshare") is None:
        return False
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        probe = subprocess.run(argv("1m", ["true"]), capture_output=True, timeout=30)
        return probe.returncode == 0
    return False

"""POSIX shared-memory segments: creation, naming, unlinking and the start-up sweep.

Every segment of a run is named ``/rt_<pid>_<hex>_<tag>``: ``pid`` is the run's
root process (the supervisor), ``hex`` a random per-run token. A segment whose
root process is dead belongs to a dead run, and :func:`sweep` unlinks it.

Segments are made with ``posix_ipc`` and mapped with ``mmap``, never through
``multiprocessing.shared_memory``: the latter registers each segment with
Python's resource tracker, which unlinks it when *any* attaching process
exits, behind the runtime's back.
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
from dataclasses import dataclass

import posix_ipc

from rt.errors import SegmentError

SHM_DIR = "/dev/shm"
NAME_RE = re.compile(r"^rt_(\d+)_([0-9a-f]+)_")


def new_run_prefix(pid: int | None = None) -> str:
    """A fresh prefix for the segments of one run, rooted at ``pid`` (default: this process)."""
    return f"rt_{os.getpid() if pid is None else pid}_{secrets.token_hex(4)}"


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists (a zombie counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Segment:
    """A mapped shared-memory segment. ``buf`` is the mapping; ``name`` has no leading slash."""

    name: str
    buf: mmap.mmap

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """Create a new segment of ``size`` bytes, mode 0600. Fails if the name exists."""
        try:
            shm = posix_ipc.SharedMemory("/" + name, posix_ipc.O_CREX, mode=0o600, size=size)
        except posix_ipc.ExistentialError as err:
            raise SegmentError(f"shared-memory segment {name!r} already exists") from err
        try:
            buf = mmap.mmap(shm.fd, size)
        finally:
            shm.close_fd()
        return cls(name, buf)

    @classmethod
    def open(cls, name: str) -> Segment:
        """Map an existing segment whole."""
        try:
            shm = posix_ipc.SharedMemory("/" + name)
        except posix_ipc.ExistentialError as err:
            raise SegmentError(
                f"shared-memory segment {name!r} does not exist (unlinked, or its run is gone)"
            ) from err
        try:
            buf = mmap.mmap(shm.fd, shm.size)
        finally:
            shm.close_fd()
        return cls(name, buf)

    @property
    def size(self) -> int:
        return len(self.buf)

    def close(self) -> None:
        """Unmap. Fails harmlessly (BufferError) while memoryviews of it are alive."""
        if not self.buf.closed:
            self.buf.close()

    def unlink(self) -> None:
        unlink(self.name)


def unlink(name: str) -> bool:
    """Remove segment ``name`` if it exists. Returns whether it existed."""
    try:
        posix_ipc.unlink_shared_memory("/" + name)
    except posix_ipc.ExistentialError:
        return False
    return True


def list_segments(prefix: str = "rt_") -> list[str]:
    """Names of this user's segments in /dev/shm that start with ``prefix``."""
    uid = os.getuid()
    names = []
    with os.scandir(SHM_DIR) as entries:
        for entry in entries:
            if entry.name.startswith(prefix):
                try:
                    if entry.stat().st_uid == uid:
                        names.append(entry.name)
                except FileNotFoundError:
                    continue
    return sorted(names)


def sweep() -> list[str]:
    """Unlink every rt segment whose run's root process is dead. Returns the names removed."""
    removed = []
    for name in list_segments():
        match = NAME_RE.match(name)
        if match and not pid_alive(int(match.group(1))) and unlink(name):
            removed.append(name)
    return removed

"""POSIX shared-memory segments: creation, naming, unlinking and the start-up sweep.

Every segment of a run is named ``/rt_<pid>_<ns>_<boot>_<hex>_<tag>``:

* ``pid`` is the run's root process (the supervisor), as its own pid
  namespace numbers it;
* ``ns`` is that pid namespace's inode (``/proc/self/ns/pid``, hex) and
  ``boot`` the first 8 hex digits of the kernel's boot id: two runs that share
  /dev/shm and a uid but not a pid namespace (two containers of one pod,
  ``--ipc=host``) see each other's segments, and a pid is only meaningful in
  the namespace (and boot) that issued it;
* ``hex`` is a random per-run token.

:func:`sweep` unlinks a segment only when it can prove the run dead: its root
pid is gone from *this* pid namespace of *this* boot, or it comes from
another boot. Segments of other namespaces, of older naming schemes, or of a
run whose namespace this process cannot read, are never touched.

Segments are made with ``posix_ipc`` and mapped with ``mmap``, never through
``multiprocessing.shared_memory``: the latter registers each segment with
Python's resource tracker, which unlinks it when *any* attaching process
exits, behind the runtime's back.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import mmap
import os
import re
import secrets
from dataclasses import dataclass
from typing import NamedTuple

import posix_ipc

from rt.errors import ResourceExhausted, SegmentError, SharedMemoryFull

SHM_DIR = "/dev/shm"
NAME_RE = re.compile(r"^rt_(\d+)_([0-9a-f]+)_([0-9a-f]{8})_([0-9a-f]{8})_")
UNKNOWN_NS, UNKNOWN_BOOT = "0", "0" * 8  # what this process could not read: never swept


class RunIdentity(NamedTuple):
    """Where a pid means something: a pid namespace (its inode) in one boot."""

    pid_ns: str
    boot: str

    @property
    def known(self) -> bool:
        return self.pid_ns != UNKNOWN_NS and self.boot != UNKNOWN_BOOT


@functools.cache
def this_run_identity() -> RunIdentity:
    """This process's pid namespace and boot (read once: neither changes under it)."""
    try:
        pid_ns = format(os.stat("/proc/self/ns/pid").st_ino, "x")
    except OSError:
        pid_ns = UNKNOWN_NS
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip().replace("-", "")[:8].lower()
    except OSError:
        boot = ""
    if not re.fullmatch(r"[0-9a-f]{8}", boot):
        boot = UNKNOWN_BOOT
    return RunIdentity(pid_ns, boot)


def new_run_prefix(pid: int | None = None) -> str:
    """A fresh prefix for the segments of one run, rooted at ``pid`` (default: this process)."""
    ident = this_run_identity()
    return run_prefix(os.getpid() if pid is None else pid, ident, secrets.token_hex(4))


def run_prefix(pid: int, ident: RunIdentity, token: str) -> str:
    return f"rt_{pid}_{ident.pid_ns}_{ident.boot}_{token}"


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists in this pid namespace (a zombie counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_is_dead(name: str, me: RunIdentity) -> bool:
    """Whether the run that made segment ``name`` is provably gone, seen from ``me``."""
    match = NAME_RE.match(name)
    if match is None or not me.known:
        return False
    pid, pid_ns, boot = int(match.group(1)), match.group(2), match.group(3)
    if boot != me.boot:
        # Made before this boot (a /dev/shm that outlived a reboot): dead,
        # unless its boot is unknown, which proves nothing.
        return boot != UNKNOWN_BOOT
    return pid_ns == me.pid_ns and not pid_alive(pid)


@dataclass
class Segment:
    """A mapped shared-memory segment. ``buf`` is the mapping; ``name`` has no leading slash."""

    name: str
    buf: mmap.mmap

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """Create a new segment of ``size`` bytes, mode 0600. Fails if the name exists."""
        segment = cls.create_new(name, size)
        if segment is None:
            raise SegmentError(f"shared-memory segment {name!r} already exists")
        return segment

    @classmethod
    def create_new(cls, name: str, size: int) -> Segment | None:
        """:meth:`create`, but None when the name is taken (by anyone: this
        user's dead run, or another local user)."""
        try:
            shm = posix_ipc.SharedMemory("/" + name, posix_ipc.O_CREX, mode=0o600, size=size)
        except posix_ipc.ExistentialError:
            return None
        except (posix_ipc.Error, OSError, ValueError) as err:
            if _out_of_fds(err):
                raise _no_fds(name) from err
            raise SegmentError(
                f"cannot create shared-memory segment {name!r} of {size} bytes in {SHM_DIR}: "
                f"{err}; check that {SHM_DIR} is writable and has room"
            ) from err
        try:
            _reserve(shm.fd, name, size)
            buf = mmap.mmap(shm.fd, size)  # (which takes an fd of its own, a dup)
        except BaseException as err:
            unlink(name)
            if isinstance(err, OSError) and _out_of_fds(err):
                raise _no_fds(name) from err
            raise
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
        except posix_ipc.PermissionsError as err:
            raise SegmentError(
                f"shared-memory segment {name!r} belongs to another user: not rt's"
            ) from err
        except OSError as err:
            raise (_no_fds(name) if _out_of_fds(err) else err) from err
        try:
            buf = mmap.mmap(shm.fd, shm.size)
        except OSError as err:
            raise (_no_fds(name) if _out_of_fds(err) else err) from err
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


def _reserve(fd: int, name: str, size: int) -> None:
    """Give a new segment its pages now. /dev/shm is a tmpfs: ``ftruncate`` only
    sets a size, and on a full one the first write to a page not yet allocated
    kills the writing process with SIGBUS, whichever process that is (the
    front's, for a large request in a default Docker container's 64 MiB).
    Reserving at creation turns that into an error the creator can handle."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return  # a filesystem that cannot reserve: pages come as they are written
        if err.errno not in (errno.ENOSPC, errno.ENOMEM):
            raise SegmentError(f"cannot reserve {size} bytes for segment {name!r}: {err}") from err
        st = os.statvfs(SHM_DIR)
        total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        fits_ever = size <= total - _kept_by_run(name)
        room = (
            f"{_mib(free)} of its {_mib(total)} are free"
            if fits_ever
            else f"more than its {_mib(total)} hold beside this run's rings"
        )
        raise SharedMemoryFull(
            f"{SHM_DIR} has no room for a segment of {_mib(size)} ({room}). Give it more "
            "room (docker run --shm-size=1g; in Kubernetes, an emptyDir with medium: Memory "
            f"mounted on {SHM_DIR})",
            fits_ever=fits_ever,
        ) from err


def _kept_by_run(name: str) -> int:
    """Bytes the run that ``name`` belongs to keeps in /dev/shm for as long as it
    runs: its rings and heartbeats (every segment but the side ones, ``_x…``)."""
    match = NAME_RE.match(name)
    if match is None:
        return 0
    prefix, kept = match.group(0), 0
    for other in list_segments(prefix):
        if other != name and "_x" not in other[len(prefix) :]:
            with contextlib.suppress(OSError):
                kept += os.stat(os.path.join(SHM_DIR, other)).st_size
    return kept


def _out_of_fds(err: Exception) -> bool:
    """EMFILE or ENFILE (posix_ipc says so in words, with no errno)."""
    text = str(err).lower()
    return getattr(err, "errno", None) in (errno.EMFILE, errno.ENFILE) or (
        "maximum number of files" in text or "too many open files" in text
    )


def _no_fds(name: str) -> ResourceExhausted:
    return ResourceExhausted(
        f"cannot open shared-memory segment {name!r}: this process is out of file "
        "descriptors (ulimit -n)"
    )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def unlink(name: str) -> bool:
    """Remove segment ``name`` if it exists and is ours to remove. Returns whether it went."""
    try:
        posix_ipc.unlink_shared_memory("/" + name)
    except (posix_ipc.ExistentialError, posix_ipc.PermissionsError):
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
    """Unlink every rt segment of a run that is provably dead (see the module's
    docstring): never one of another pid namespace. Returns the names removed."""
    me = this_run_identity()
    return [name for name in list_segments() if run_is_dead(name, me) and unlink(name)]

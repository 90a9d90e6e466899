"""What a run may leave behind, and a check that it left nothing.

* zombies: children of this process that exited and were never reaped;
* processes: children still running, and orphans: processes anywhere that
  carry this process's tag in their environment (``RT_CHAOS_TAG``, set by
  :func:`tag_environment` and inherited by every descendant: rt's actors,
  an rt-serve subprocess and its actors) but are not our children;
* segments: ``/dev/shm/rt_<root pid>_*`` of the engine's root process;
* fds: eventfds, pidfds, sockets, pipes and shared-memory maps this process
  opened and did not close.

Take a :class:`Snapshot` before, and :func:`leaks` after: it waits for
dying processes to go (up to ``settle_s``) and lists what is still there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

TAG = "RT_CHAOS_TAG"
WATCHED_FDS = ("anon_inode:[eventfd]", "anon_inode:[pidfd]", "socket:", "pipe:", "/dev/shm/")


def tag_environment() -> str:
    """Tag this process's environment (once) so its descendants can be found."""
    return os.environ.setdefault(TAG, f"{os.getpid()}-{time.monotonic_ns()}")


@dataclass(frozen=True)
class Snapshot:
    fds: dict[int, str]
    segments: frozenset[str]
    children: frozenset[int]
    tagged: frozenset[int] = frozenset()  # descendants running already (with a tag given)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    state, ppid = stat[stat.rindex(b")") + 2 :].split()[:2]
    return state.decode(), int(ppid)


def processes(tag: str | None = None) -> tuple[dict[int, str], list[int]]:
    """(our children: pid → state, running processes carrying ``tag`` that are not)."""
    me, mark = os.getpid(), f"{TAG}={tag}".encode() if tag else None
    children, tagged = {}, []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        info = _stat(pid)
        if info is None:
            continue
        state, ppid = info
        if ppid == me:
            children[pid] = state
        elif mark is not None and state != "Z":
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        tagged.append(pid)
            except OSError:
                continue
    return children, tagged


def fds() -> dict[int, str]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(WATCHED_FDS):
            out[int(name)] = target
    return out


def segments(root_pids: Iterable[int] = ()) -> frozenset[str]:
    """rt's segments of the given root processes (all of rt's when none are given)."""
    prefixes = tuple(f"rt_{pid}_" for pid in root_pids) or ("rt_",)
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return frozenset()
    return frozenset(n for n in names if n.startswith(prefixes))


def snapshot(root_pids: Iterable[int] = (), tag: str | None = None) -> Snapshot:
    """What is open now; with ``tag``, the tagged processes running already too (a
    server started before it: its actors are no orphans the body left)."""
    children, tagged = processes(tag)
    segs = segments(root_pids or (os.getpid(),))
    return Snapshot(fds(), segs, frozenset(children), frozenset(tagged))


def leaks(
    before: Snapshot,
    root_pids: Iterable[int] = (),
    tag: str | None = None,
    ignore_pids: Iterable[int] = (),
    settle_s: float = 10.0,
) -> list[str]:
    """What was left since ``before``: one line per kind of leak (empty: nothing)."""
    ignore = set(ignore_pids) | set(before.children) | set(before.tagged)
    roots = tuple(root_pids) or (os.getpid(),)
    deadline = time.monotonic() + settle_s
    while True:
        children, tagged = processes(tag)
        children = {p: s for p, s in children.items() if p not in ignore}
        tagged = [p for p in tagged if p not in ignore and p not in children]
        running = {p: s for p, s in children.items() if s != "Z"}
        if not (running or tagged) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    out = []
    zombies = sorted(p for p, s in children.items() if s == "Z")
    if zombies:
        out.append(f"zombies (children never reaped): {zombies}")
    if running:
        out.append(f"child processes still running: {sorted(running)}")
    if tagged:
        out.append(f"orphan processes still running: {sorted(tagged)}")
    left = segments(roots) - before.segments
    if left:
        out.append(f"shared-memory segments left in /dev/shm: {sorted(left)}")
    opened = {fd: t for fd, t in fds().items() if before.fds.get(fd) != t}
    if opened:
        out.append(f"fds left open: {opened}")
    return out

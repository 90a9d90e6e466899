"""Signal a named actor, wait for it to come back, read its restart count.

Each helper takes an engine (``rt.open_engine``) or a :class:`~rt.testing.Server`.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import trio

from rt.chaos.targets import ActorInfo, EngineTarget, ServerTarget, Target


def target_of(obj: Any) -> Target:
    if hasattr(obj, "supervisor"):
        return EngineTarget(obj)
    return ServerTarget(obj.url, obj.http)


async def actor(obj: Any, name: str) -> ActorInfo:
    for a in await target_of(obj).actors():
        if a.name == name:
            return a
    raise KeyError(f"no actor named {name!r}")


async def actor_pid(obj: Any, name: str) -> int:
    """The pid of ``name`` (it must be running)."""
    a = await actor(obj, name)
    if a.pid is None:
        raise RuntimeError(f"actor {name!r} is {a.state}: no pid to signal")
    return a.pid


async def kill_actor(obj: Any, name: str, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` (SIGKILL by default) to actor ``name``; returns its pid."""
    pid = await actor_pid(obj, name)
    os.kill(pid, sig)
    return pid


async def stop_actor(obj: Any, name: str) -> int:
    """SIGSTOP actor ``name`` (a hang; the watchdog kills it after
    ``watchdog_timeout`` unless :func:`continue_actor` comes first); its pid."""
    return await kill_actor(obj, name, signal.SIGSTOP)


def continue_actor(pid: int) -> None:
    """SIGCONT a pid :func:`stop_actor` returned (no error if it is gone)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


async def restart_count(obj: Any, name: str) -> int:
    return (await actor(obj, name)).restarts


async def wait_healthy(obj: Any, timeout: float = 120.0, poll: float = 0.05) -> None:
    """Until every actor is running and the health answer is ok (else TooSlowError)."""
    target = target_of(obj)
    with trio.fail_after(timeout):
        while True:
            try:
                if await target.healthy():
                    return
            except Exception:  # a server between answers
                pass
            await trio.sleep(poll)


async def wait_restarted(
    obj: Any, name: str, restarts: int = 1, timeout: float = 120.0, poll: float = 0.05
) -> None:
    """Until ``name`` has restarted ``restarts`` times and runs again."""
    with trio.fail_after(timeout):
        while True:
            a = await actor(obj, name)
            if a.restarts >= restarts and a.state == "running":
                return
            await trio.sleep(poll)

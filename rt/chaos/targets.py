"""What the harness reads from the engine under test: its actors and its health.

:class:`EngineTarget` reads an in-process engine's supervisor (exact exit
times); :class:`ServerTarget` reads rt-serve's ``/server_info`` and
``/health`` (what a user of the server sees).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ActorInfo:
    name: str
    pid: int | None
    state: str
    incarnation: int
    restarts: int
    reason: str | None = None
    exit_at: float | None = None  # time.monotonic() of the last exit, when known


class Target(Protocol):
    label: str
    poll_s: float  # how often the monitor samples it

    async def actors(self) -> list[ActorInfo]: ...

    async def healthy(self) -> bool: ...


class EngineTarget:
    """An engine from ``rt.open_engine`` in this process."""

    label = "in-process"
    poll_s = 0.025

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def actors(self) -> list[ActorInfo]:
        return [
            ActorInfo(
                a.name,
                a.pid,
                str(a.state.value),
                a.incarnation,
                a.restart_count,
                a.last_exit_reason,
                a.last_exit_at,
            )
            for a in self.engine.supervisor.status().actors
        ]

    async def healthy(self) -> bool:
        """What /health answers (rt.frontend.health): an actor killed or stopped is
        down from the signal on, not once its supervisor has seen it (~0.3 s later)."""
        from rt.frontend.health import unhealthy  # (here: rt.chaos imports no torch)

        return unhealthy(self.engine) is None


class ServerTarget:
    """rt-serve at ``url``, through its HTTP endpoints."""

    poll_s = 0.1  # two requests a sample: keep the server's own load small

    def __init__(self, url: str, http: Any) -> None:
        self.url, self.http, self.label = url, http, url
        self.last_info: dict[str, Any] = {}

    async def info(self) -> dict[str, Any]:
        response = await self.http.get(f"{self.url}/server_info", timeout=10)
        response.raise_for_status()
        self.last_info = response.json()
        return self.last_info

    async def actors(self) -> list[ActorInfo]:
        info = await self.info()
        out = []
        for a in info.get("actors", ()):
            exit_at = a.get("last_exit_at")
            out.append(
                ActorInfo(
                    a["name"],
                    a.get("pid"),
                    a.get("state", "running"),
                    int(a.get("incarnation", 1)),
                    int(a.get("restart_count", 0)),
                    a.get("last_exit_reason"),
                    float(exit_at) if isinstance(exit_at, int | float) else None,
                )
            )
        return out

    async def healthy(self) -> bool:
        response = await self.http.get(f"{self.url}/health", timeout=10)
        return bool(response.status_code == 200)


async def wait_until(target: Target, condition: Any, timeout: float, poll: float = 0.05) -> bool:
    """Poll ``condition(actors)`` until it holds or ``timeout`` passes."""
    import trio

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition(await target.actors()):
                return True
        except Exception:  # a server between answers
            pass
        await trio.sleep(poll)
    return False

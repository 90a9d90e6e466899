"""An engine or an rt-serve subprocess with a fault plan, for the body of an ``async with``."""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from rt.actors.faultplan import FaultPlan

Faults = Iterable[Mapping[str, Any]] | FaultPlan | None


def crash(
    actor: str, point: str, *, after: int = 0, action: str = "sigkill", **rule: Any
) -> dict[str, Any]:
    """A fault-plan rule that crashes ``actor`` at its ``after+1``-th pass of
    ``point``, in its first incarnation only (so it recovers)."""
    return {"actor": actor, "point": point, "action": action, "after": after,
            "incarnation": 1, **rule}  # fmt: skip


def plan_of(faults: Faults, seed: int = 0) -> FaultPlan | None:
    if faults is None or isinstance(faults, FaultPlan):
        return faults
    return FaultPlan.from_dict({"seed": seed, "faults": [dict(r) for r in faults]})


@asynccontextmanager
async def open_engine(
    model_path: str | None = None, *, faults: Faults = None, seed: int = 0, **options: Any
) -> AsyncIterator[Any]:
    """``rt.open_engine`` with ``faults``: rules of rt's fault plan (dicts, see
    :mod:`rt.actors.faultplan`, or :func:`crash`) or a ``FaultPlan``."""
    import rt

    plan = plan_of(faults, seed)
    if plan is not None:
        options["fault_plan"] = plan
    async with rt.open_engine(model_path, **options) as engine:
        yield engine


class Server:
    """A running rt-serve: ``url``, ``pid``, its stderr lines so far (``log``),
    and an ``http`` client (httpx) for its endpoints."""

    def __init__(self, process: Any, http: Any) -> None:
        self._process = process
        self.http = http
        self.url: str = process.url
        self.pid: int = process.pid

    @property
    def log(self) -> list[str]:
        return [line for _, line in self._process.lines]

    async def info(self) -> dict[str, Any]:
        response = await self.http.get(f"{self.url}/server_info")
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    async def stop(self, timeout: float = 120.0) -> int:
        """SIGTERM (it drains), then its exit code (SIGKILL after ``timeout``)."""
        return int(await self._process.stop(timeout))


SERVED: list[int] = []  # the pid of every rt-serve open_server started, in order


@asynccontextmanager
async def open_server(
    *args: str, faults: Faults = None, seed: int = 0, start_timeout: float = 300.0
) -> AsyncIterator[Server]:
    """``rt-serve --host 127.0.0.1 --port 0 ARGS`` (with ``--fault-plan`` from
    ``faults``), stopped with SIGTERM when the body exits."""
    import httpx

    from rt.chaos.server import open_server as start

    plan = plan_of(faults, seed)
    with tempfile.TemporaryDirectory(prefix="rt-testing-") as tmp:
        argv = list(args)
        if plan is not None:
            path = Path(tmp) / "plan.json"
            path.write_text(json.dumps(_plan_dict(plan)))
            argv += ["--fault-plan", str(path)]
        with open(Path(tmp) / "rt-serve.log", "wb") as log:
            async with (
                httpx.AsyncClient(timeout=60) as http,
                start(argv, log, start_timeout=start_timeout) as process,
            ):
                SERVED.append(process.pid)  # (no_leaks checks its segments too)
                yield Server(process, http)


def _plan_dict(plan: FaultPlan) -> dict[str, Any]:
    from dataclasses import asdict

    rules = [{k: v for k, v in asdict(r).items() if v is not None} for r in plan.rules]
    for rule in rules:
        rule["action"] = str(rule["action"])
    return {"seed": plan.seed, "faults": rules}

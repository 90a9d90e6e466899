"""Runs against rt-serve: one the harness starts (``server``) or a running one
(``attach``). Requests go over SSE (``POST /generate``) and WebSocket
(``/ws``) as each request's ``transport`` says."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import trio

from rt.chaos import leaks
from rt.chaos.ledger import Ledger
from rt.chaos.run import (
    RunConfig,
    drive,
    engine_options,
    kill_during_shutdown,
    put_in_flight,
    removed,
    shutdown_fault,
    write_plan,
)
from rt.chaos.schedule import Schedule
from rt.chaos.targets import ServerTarget
from rt.chaos.transports import End, Sender, Sink, sse_sender
from rt.chaos.workload import RequestSpec
from rt.chaos.ws import WsPool, open_ws_pool, ws_sender


def server_args(options: dict[str, Any], plan: str | None) -> list[str]:
    """rt-serve's flags for engine options (its own table of flags)."""
    from rt.serve import ENGINE_FLAGS, SWITCHES

    flags = {f.option: f.name for f in ENGINE_FLAGS}
    switches = {option: (name, value) for name, (option, value, _) in SWITCHES.items()}
    args: list[str] = []
    for option, value in {**options, "fault_plan": plan}.items():
        if value is None:
            continue
        if option in switches:
            name, when = switches[option]
            if value == when:
                args.append(name)
        elif option in flags:
            args += [flags[option], str(value)]
        else:
            raise ValueError(f"rt-serve has no flag for engine option {option!r}")
    return args


def _sender(http: Any, url: str, pool: WsPool, run_id: str) -> Sender:
    senders = {"sse": sse_sender(http, url, run_id), "ws": ws_sender(pool)}

    async def send(spec: RequestSpec, sink: Sink) -> End:
        return await senders.get(spec.transport, senders["sse"])(spec, sink)

    return send


async def run_server(
    config: RunConfig, schedule: Schedule, ledger: Ledger, tag: str, hog_pids: list[int]
) -> None:
    import httpx

    from rt.chaos.server import open_server

    plan = write_plan(config, schedule)
    before = leaks.snapshot()
    log = open(Path(config.log_dir) / f"rt-serve-{config.seed}.log", "ab")  # noqa: SIM115
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    server_pid = None
    with log, removed(plan):  # (the plan file: however the run ends, a Ctrl-C too)
        async with httpx.AsyncClient(timeout=None, limits=limits) as http:
            try:
                async with open_server(server_args(engine_options(config), plan), log) as server:
                    server_pid = server.pid
                    assert server.url is not None
                    run_id = f"{config.seed}-{time.monotonic_ns()}"
                    async with open_ws_pool(server.url, min(config.concurrency, 4)) as pool:
                        sender = _sender(http, server.url, pool, run_id)
                        async with trio.open_nursery() as outer:
                            target = ServerTarget(server.url, http)
                            load, monitor = await drive(
                                config, schedule, ledger, target, sender, server.lines
                            )
                            await put_in_flight(config, outer, sender, ledger, load)
                            ledger.write("shutdown", what="SIGTERM to rt-serve")
                            started = time.monotonic()
                            server.terminate()
                            fault = shutdown_fault(schedule)
                            if fault is not None:
                                outer.start_soon(kill_during_shutdown, fault, monitor, ledger, 0.2)
                            # the requests in flight finish (the drain) before it exits
                    code = await server.stop(120.0)
                    ledger.write("shutdown", what="rt-serve exited",
                                 seconds=time.monotonic() - started)  # fmt: skip
                ledger.write("server", code=code, tail="\n".join(list(server.tail)[-3:]))
            except (RuntimeError, BaseExceptionGroup) as err:  # it never became ready
                if isinstance(err, BaseExceptionGroup):  # (out of a nursery: a group of it)
                    never, other = err.split(RuntimeError)
                    if never is None or other is not None:
                        raise
                    while isinstance(err, BaseExceptionGroup):
                        err = err.exceptions[0]
                if server_pid is not None:  # (it had: the harness's own RuntimeError)
                    ledger.write("error", what=f"the harness raised {type(err).__name__}: {err}")
                else:
                    ledger.write("server", code=-1, tail=str(err)[-2000:])
    if server_pid is not None:
        for line in leaks.leaks(before, root_pids=[server_pid], tag=tag, ignore_pids=hog_pids):
            ledger.write("leak", what=line)


async def run_attached(config: RunConfig, schedule: Schedule, ledger: Ledger) -> None:
    import httpx

    assert config.url is not None
    if schedule.plan() is not None:
        ledger.write(
            "note",
            what="attached: the plan's faults need --fault-plan at rt-serve's start; only signal faults fire",
        )
    plain = Schedule(schedule.seed, tuple(f for f in schedule.signals() if f.phase != "shutdown"))
    url = config.url.rstrip("/")
    async with (
        httpx.AsyncClient(timeout=None) as http,
        open_ws_pool(url, min(config.concurrency, 4)) as pool,
    ):
        sender = _sender(http, url, pool, f"{config.seed}-{time.monotonic_ns()}")
        await drive(config, plain, ledger, ServerTarget(url, http), sender, None)

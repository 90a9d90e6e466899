"""One chaos run: an engine under load while a schedule's faults fire, then its
shutdown, then a leak check; everything goes to a ledger.

Three targets (``RunConfig.mode``):

* ``engine``: ``rt.open_engine`` in this process (plan faults through
  ``fault_plan``; their stderr lines through a tap on fd 2);
* ``server``: an ``rt-serve`` subprocess on 127.0.0.1 (``--fault-plan``),
  driven over HTTP SSE and WebSocket, stopped by SIGTERM (a drain);
* ``attach``: a running rt-serve at ``url``: signal faults only (its pids
  must be on this host), no shutdown, no leak check.

The shutdown phase: a few long requests are put in flight, the shutdown
begins (leaving ``open_engine``; SIGTERM to rt-serve), and the schedule's
shutdown fault, if any, kills an actor in the middle of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

from rt.chaos import leaks
from rt.chaos.hogs import hogs
from rt.chaos.inject import Injector
from rt.chaos.ledger import Ledger
from rt.chaos.load import Load
from rt.chaos.monitor import Lines, Monitor, StderrTap, record_fault_lines
from rt.chaos.schedule import Fault, Schedule
from rt.chaos.targets import Target
from rt.chaos.transports import Sender, run_request
from rt.chaos.workload import RequestSpec, WorkloadConfig, draw_request

SHUTDOWN_INDEX = 1_000_000  # the shutdown phase's requests: indexes of their own
SETTLE_S = 60.0  # after the load, how long the actors get to be running again


@dataclass(frozen=True)
class RunConfig:
    seed: int = 1
    mode: str = "engine"  # engine | server | attach
    url: str | None = None
    requests: int | None = 40
    duration: float | None = None
    concurrency: int = 8
    timeout: float = 180.0  # per request
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    engine: dict[str, Any] = field(default_factory=dict)  # rt.EngineOptions
    hogs: int = 0
    shutdown_requests: int = 2
    # a count of ``requests`` goes on (up to 4 times as many) until every signal
    # fault was tried: on a fast engine the load would otherwise end first
    until_faults: bool = True
    log_dir: str = "."

    def draw(self, index: int) -> RequestSpec:
        return draw_request(self.seed, index, self.workload)


def shutdown_specs(config: RunConfig) -> list[RequestSpec]:
    """Long, innocent, uncancelled requests that are in flight when the shutdown begins."""
    calm = replace(
        config.workload, cancel_share=0.0, invalid_share=0.0, fuzz_share=0.0, poison_markers=()
    )
    out = []
    for k in range(config.shutdown_requests):
        spec = draw_request(config.seed, SHUTDOWN_INDEX + k, calm)
        out.append(replace(spec, max_new_tokens=config.workload.max_tokens[1] * 2, stream=True))
    return out


async def run_once(config: RunConfig, schedule: Schedule, ledger: Ledger) -> None:
    ledger.write("run", seed=config.seed, mode=config.mode, schedule=schedule.to_json(),
                 config=_jsonable(asdict(config)), started=time.time())  # fmt: skip
    tag = leaks.tag_environment()
    with hogs(config.hogs) as hog_pids:
        if hog_pids:
            ledger.write("note", what=f"{len(hog_pids)} CPU hog(s): {hog_pids}")
        if config.mode == "engine":
            await _run_engine(config, schedule, ledger, tag, hog_pids)
        else:
            from rt.chaos.http_run import run_attached, run_server

            if config.mode == "server":
                await run_server(config, schedule, ledger, tag, hog_pids)
            else:
                await run_attached(config, schedule, ledger)
    ledger.write("done")


class Interrupted(KeyboardInterrupt):
    """A signal stopped the run's engine (Ctrl-C in the harness's terminal): the
    campaign ends, with no verdict and no shrink (its refusals and its early stop
    are no finding of rt's)."""


def write_plan(config: RunConfig, schedule: Schedule) -> str | None:
    plan = schedule.plan()
    if plan is None:
        return None
    path = Path(config.log_dir) / f"plan-{config.seed}-{os.getpid()}-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(plan))
    return str(path)


async def drive(
    config: RunConfig,
    schedule: Schedule,
    ledger: Ledger,
    target: Target,
    sender: Sender,
    lines: Lines | None,
) -> tuple[Load, Monitor]:
    """The load, the monitor and the injector until the load is done and the
    actors have settled."""
    load: Load

    async def one(spec: RequestSpec) -> None:
        await run_request(spec, sender, ledger, load.live, config.timeout)

    signals = [f for f in schedule.signals() if f.phase != "shutdown"]
    tried = trio.Event() if config.until_faults and signals else None
    load = Load(config.draw, one, config.concurrency, config.requests, config.duration, tried)
    plan_faults = [f for f in schedule.faults if f.via == "plan"]
    monitor = Monitor(target, ledger, load.live, plan_faults, lines, target.poll_s)
    # a backlog's reader stays stopped for at most 60% of the watchdog's timeout
    watchdog = float(config.engine.get("watchdog_timeout", 30.0))
    injector = Injector(load, monitor, ledger, hold_s=0.6 * watchdog)

    async def inject() -> None:
        await injector.run(signals)
        if tried is not None:
            tried.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(monitor.run)
        nursery.start_soon(inject)
        await load()
        with trio.move_on_after(SETTLE_S):
            await monitor.wait_for(lambda m: all(a.state == "running" for a in m.actors.values()))
        nursery.cancel_scope.cancel()
    injector.release()
    await monitor.sample()
    return load, monitor


async def put_in_flight(
    config: RunConfig,
    nursery: trio.Nursery,
    sender: Sender,
    ledger: Ledger,
    load: Load,
) -> None:
    """Start the shutdown phase's requests and wait (bounded) for their first tokens."""
    specs = shutdown_specs(config)
    for spec in specs:
        nursery.start_soon(run_request, spec, sender, ledger, load.live, config.timeout, True)
    with trio.move_on_after(30):
        await load.live.wait_for(
            lambda live: all(
                s.index in live.requests and live.requests[s.index].tokens > 0 for s in specs
            )
        )


def shutdown_fault(schedule: Schedule) -> Fault | None:
    return next((f for f in schedule.signals() if f.phase == "shutdown"), None)


async def kill_during_shutdown(
    fault: Fault, monitor: Monitor, ledger: Ledger, after_s: float
) -> None:
    from rt.chaos.inject import SIGNALS

    info = monitor.actors.get(fault.actor)
    if info is None or info.pid is None:
        return
    await trio.sleep(after_s)
    ledger.write("fault", id=fault.id, kind=fault.kind, actor=fault.actor, via="signal",
                 pid=info.pid, phase="shutdown", observed="shutdown", crash=fault.crash)  # fmt: skip
    try:
        os.kill(info.pid, SIGNALS[fault.kind])
        if fault.kind == "sigstop":
            await trio.sleep(fault.stop_s or 1.0)
            os.kill(info.pid, 18)  # SIGCONT: a stopped actor must not outlive the run
    except ProcessLookupError:
        pass


def engine_options(config: RunConfig) -> dict[str, Any]:
    """The run's engine options, on the CPU unless it says otherwise: where the
    replayer that judges the outputs runs them."""
    return {"device": "cpu", **config.engine}


async def _run_engine(
    config: RunConfig, schedule: Schedule, ledger: Ledger, tag: str, hog_pids: list[int]
) -> None:
    import rt
    from rt.chaos.targets import EngineTarget
    from rt.chaos.transports import engine_sender

    options = engine_options(config)
    plan = write_plan(config, schedule)
    if plan is not None:
        options["fault_plan"] = plan
    log = open(Path(config.log_dir) / f"stderr-{config.seed}.log", "ab")  # noqa: SIM115
    opened: list[Any] = []  # the engine, once open: its stopped_by, however it ends
    own: list[BaseException] = []  # what the harness's own part of the body raised
    out_of_engine: list[BaseException] = []  # what came out of open_engine
    with log, StderrTap(log).installed() as lines, removed(plan):
        before = leaks.snapshot()
        started = time.monotonic()  # (a signal may end the body before it is set below)
        try:
            async with trio.open_nursery() as outer, _caught(out_of_engine):
                async with rt.open_engine(**options) as engine:
                    opened.append(engine)
                    try:
                        sender = engine_sender(engine)
                        load, monitor = await drive(
                            config, schedule, ledger, EngineTarget(engine), sender, lines
                        )
                        await put_in_flight(config, outer, sender, ledger, load)
                        fault = shutdown_fault(schedule)
                        if fault is not None:
                            outer.start_soon(kill_during_shutdown, fault, monitor, ledger, 0.05)
                    except Exception as err:
                        own.append(err)
                        raise
                    ledger.write("shutdown", what="leaving open_engine")
                    started = time.monotonic()
                ledger.write("shutdown", what="engine stopped", seconds=time.monotonic() - started)
                for a in engine.actors():
                    ledger.write("stopped", name=a.name, reason=a.last_exit_reason)
        except Exception as err:  # an escalation comes out of open_engine as a group
            if _harnesss(err, own, out_of_engine):
                ledger.write("error", what=f"the harness raised {_innermost(err)}")
            else:  # out of the engine (its tasks, its start, its stop): it gave up
                ledger.write("escalated", error=_innermost(err))
        plan_faults = [f for f in schedule.faults if f.via == "plan"]
        record_fault_lines(ledger, lines, plan_faults, "shutdown")  # the last ones
        for line in leaks.leaks(before, tag=tag, ignore_pids=hog_pids):
            ledger.write("leak", what=line)
    # (open_engine takes SIGINT in the main thread: a drain, ended well or not)
    stopped_by = opened[0].stopped_by if opened else None
    if stopped_by is not None:
        ledger.write("note", what=f"interrupted by {stopped_by}")
        raise Interrupted(stopped_by)


@contextlib.contextmanager
def removed(plan: str | None) -> Iterator[None]:
    """The run's plan file is removed at its end (a Ctrl-C before the engine was up too)."""
    try:
        yield
    finally:
        if plan is not None:
            Path(plan).unlink(missing_ok=True)


@contextlib.asynccontextmanager
async def _caught(into: list[BaseException]) -> AsyncIterator[None]:
    """Keep what comes out of the body in ``into`` (and let it go on)."""
    try:
        yield
    except BaseException as err:
        into.append(err)
        raise


def _harnesss(
    err: BaseException, own: list[BaseException], out_of_engine: list[BaseException]
) -> bool:
    """Whether ``err`` is the harness's own trouble: none of its leaves (Cancelled
    echoes aside) came out of the engine (its tasks, its start, its stop) rather
    than the harness's part of the body, and none is one of rt's errors."""
    from rt.errors import RtError
    from rt.groups import leaves

    raised = [e for e in leaves(err) if not isinstance(e, trio.Cancelled)]
    engines = {id(e) for e in leaves(out_of_engine[0])} if out_of_engine else set()
    engines -= {id(e) for e in leaves(own[0])} if own else set()
    return bool(raised) and not any(id(e) in engines or isinstance(e, RtError) for e in raised)


def _innermost(err: BaseException) -> str:
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return f"{type(err).__name__}: {str(err)[:400]}"


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))

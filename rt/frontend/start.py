"""``rt.open_engine``: the engine's processes started, supervised, and stopped
around the body of an ``async with`` (the engine itself: rt/frontend/engine.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from rt import errors
from rt.actors import open_supervisor
from rt.actors.faultplan import FaultPlan
from rt.config import EngineOptions
from rt.frontend.drain import stop_on_signal
from rt.frontend.engine import Engine
from rt.frontend.wiring import supervisor_spec
from rt.groups import lone, made_of, only, raise_as_is

log = logging.getLogger("rt.frontend.engine")  # (where open_engine's lines have always come from)


@asynccontextmanager
async def open_engine(model_path: str | None = None, **options: Any) -> AsyncIterator[Engine]:
    """Start the engine (tokenizer, scheduler and detokenizer processes, supervised)
    for the body of the ``async with``. ``model_path=None`` serves the shipped default
    model; ``options`` are those of :class:`rt.config.EngineOptions`.

    In the main thread, SIGTERM, SIGINT and SIGHUP stop the engine gracefully: new
    requests are refused (EngineShutdownError), those in flight get up to
    ``drain_timeout`` seconds to finish (a second signal: none), those left then
    fail with EngineShutdownError (escaping the body, it ends it as the stop would),
    then the body is cancelled and the ``async with`` exits normally, with every process
    stopped and every segment unlinked; ``engine.stopped_by`` names the signal.

    A start that fails raises its own error, never a group: ConfigError for options
    no engine could take (before any process starts), EscalationError for an actor
    that cannot start, KeyboardInterrupt for a Ctrl-C that came first."""
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        raise RuntimeError(
            "rt.open_engine runs in a trio run (trio.run, or anyio on its trio backend), "
            "and this is none: under asyncio, run it in a thread of its own with trio.run"
        ) from None
    opts = EngineOptions.build(model_path=model_path, **options)
    opts.check_device()  # CUDA asked for on a host without it: before any process starts
    opts.check_model_dir()  # a model rt cannot build (architecture, shapes, EOS): before too
    defaults = opts.model_sampling_defaults()  # refused before any process starts too
    if defaults:
        log.info("sampling parameters a request leaves out: the model's %s", defaults)
    spec, plan = supervisor_spec(opts), opts.fault_plan
    plan = FaultPlan.load(plan) if isinstance(plan, str) else plan
    raised: list[BaseException] = []  # by the body of the ``async with``
    try:
        async with open_supervisor(spec, fault_plan=plan) as supervisor:
            engine = Engine(opts, supervisor)
            try:
                async with trio.open_nursery() as nursery:
                    for worker, rx in enumerate(engine._from_tok):
                        nursery.start_soon(engine.route_tokenized, rx, worker)
                    nursery.start_soon(engine.route_deltas)
                    nursery.start_soon(engine.controls.run)
                    nursery.start_soon(engine.watch_scheduler)
                    nursery.start_soon(engine.watch_stalls)
                    if threading.current_thread() is threading.main_thread():
                        nursery.start_soon(stop_on_signal, engine, nursery.cancel_scope)
                    try:
                        yield engine
                    except BaseException as err:
                        if engine.stopped_by and made_of(
                            err, errors.EngineShutdownError, trio.Cancelled
                        ):
                            return  # what the drain cut off: the stop, as asked
                        raised.append(err)
                        raise
                    finally:
                        nursery.cancel_scope.cancel()
            finally:
                engine.close()  # after the routing tasks are gone: they use the rings
    except BaseExceptionGroup as group:
        # what the body raised, as itself (rt/groups.py); beside an escalation, a group
        if raised and only(group, raised[0]):
            raise_as_is(raised[0])
        single = lone(group)  # an escalation or a Ctrl-C alone, as itself too
        if single is not None:
            raise_as_is(single)
        raise

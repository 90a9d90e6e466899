"""Health, state and control: ``/health`` (and ``/ping``), ``/health_generate``,
``/version``, ``/server_info``, ``/get_model_info``, ``/metrics``,
``/abort_request``, ``/flush_cache``, ``/pause_generation``,
``/continue_generation``."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import uuid
from typing import Any

import trio

import rt
from rt import errors
from rt.actors.affinity import format_cpu_list
from rt.frontend.health import state_of
from rt.http.asgi import Exchange, HTTPError
from rt.http.front import Front, http_error
from rt.http.generation import Job, run
from rt.http.metrics import CONTENT_TYPE
from rt.http.openai_api import served_name
from rt.http.schemas import (
    AbortRequest,
    ContinueRequest,
    FlushCacheRequest,
    PauseRequest,
    parse,
)

PAUSED = "generation is paused (POST /continue_generation resumes it)"


def _unready(front: Front) -> str | None:
    """Why a request could not complete now: an actor down, or generation paused
    (requests are still taken then, and held until it resumes)."""
    reason = front.unhealthy()
    if reason is None and front.engine.paused:
        return PAUSED
    return reason


async def health(front: Front, ex: Exchange) -> None:
    """200 only when every actor is running and generation is not paused (a
    request can complete); 503 with the reason."""
    reason = _unready(front)
    if reason is None:
        await ex.json({"status": "ok"})
    else:
        await ex.json({"status": "unavailable", "reason": reason}, 503, [("retry-after", "1")])


async def version(front: Front, ex: Exchange) -> None:
    """vLLM's and SGLang's ``/version``."""
    await ex.json({"version": rt.__version__})


async def health_generate(front: Front, ex: Exchange) -> None:
    """Generates one token, bypassing the queue limit. Whenever /health is 503
    (generation paused, an actor down, suspects being told apart, …) nothing
    could come: 503 at once, with /health's reason, not after the timeout."""
    reason = _unready(front)
    if reason is not None:
        raise HTTPError(503, reason, headers=[("retry-after", "1")])
    rid = f"health-{uuid.uuid4().hex}"
    job = Job(None, {"input_ids": [0], "max_new_tokens": 1, "rid": rid}, rid)
    timeout = front.settings.health_generate_timeout
    results = []
    with trio.move_on_after(timeout) as deadline:
        async with ex.cancel_on_disconnect():
            # never refused by the queue limit; no user's traffic: not in the metrics
            results = await run(front, [job], limited=False, counted=False)
    if ex.disconnected:
        return
    if deadline.cancelled_caught:
        raise HTTPError(503, f"a one-token generation did not finish within {timeout:g} s")
    (result,) = results
    if result.aborted is not None or result.completion_tokens != 1:
        # an abort is no failure of run(): POST /abort_request's abort_all takes the probe too
        cause = result.aborted or "it ended with no token"
        raise HTTPError(503, f"a one-token generation did not finish: {cause}")
    await ex.json({"status": "ok"})


async def server_info(front: Front, ex: Exchange) -> None:
    options = front.engine.options
    config = options.model_dump(mode="json", exclude={"fault_plan"})
    config["fault_plan"] = None if options.fault_plan is None else str(options.fault_plan)
    settings = dataclasses.asdict(front.settings)
    settings["api_key"] = "<set>" if settings["api_key"] else None
    if settings["max_connections"] is None:  # (fitted to the open files' limit)
        settings["max_connections"] = front.max_connections
    stats = front.scheduler
    scheduler = None if stats is None else _struct(stats)
    pool = None if stats is None else stats.request_tokens + stats.cached_tokens + stats.free_tokens
    await ex.json(
        {
            # SGLang's keys, as its clients read them: the server's arguments at the
            # top (model_path, …), and the scheduler's state under internal_states
            # (sglang.bench_serving reads internal_states[0] after its run)
            **config,
            "model_path": options.resolved_model_path(),  # (not None for the default model)
            "tokenizer_path": options.resolved_tokenizer_path(),
            "context_length": front.context_length,
            # SGLang's: the KV pool's tokens, and the longest prompt that may come
            "max_total_num_tokens": pool,
            "max_req_input_len": None if pool is None else min(front.context_length, pool) - 1,
            "tp_size": 1,
            "dp_size": 1,
            "internal_states": [scheduler or {}],
            "version": rt.__version__,
            "model": {
                "id": served_name(front),
                "path": options.resolved_model_path(),
                "context_length": front.context_length,
                "vocab_size": front.vocab_size,
                "sampling_defaults": front.engine.sampling_defaults,  # generation_config.json's
            },
            "config": config,
            "server": settings,
            "healthy": _unready(front) is None,
            "paused": front.engine.paused,
            "stopping": front.stopping,
            "requests_in_flight": len(front.in_flight),
            "scheduler": scheduler,
            "actors": [
                {
                    "name": a.name,
                    "pid": a.pid,
                    "state": state_of(a),
                    "incarnation": a.incarnation,
                    "restart_count": a.restart_count,
                    "last_exit_reason": a.last_exit_reason,
                    "heartbeat_age": a.heartbeat_age,
                    "cpus": _cpus(a.pid),
                }
                for a in front.engine.actors()
            ],
        }
    )


async def model_info(front: Front, ex: Exchange) -> None:
    """SGLang's ``/get_model_info``: what its clients (``sglang.RuntimeEndpoint``)
    read when they connect."""
    options = front.engine.options
    path = options.resolved_model_path()
    config = _model_config(path)
    defaults = front.engine.sampling_defaults
    await ex.json(
        {
            "model_path": path,
            "tokenizer_path": options.resolved_tokenizer_path(),
            "is_generation": True,
            # (SGLang's is its --preferred-sampling-params, a JSON text; rt's are the
            # defaults the model's generation_config.json sets)
            "preferred_sampling_params": json.dumps(defaults) if defaults else None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": config.get("model_type"),
            "architectures": config.get("architectures"),
        }
    )


@functools.cache
def _model_config(path: str) -> dict[str, Any]:
    """The model's config.json (read once: the event loop waits on the disk)."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _cpus(pid: int | None) -> str | None:
    """The CPUs a running actor may use, as ``taskset -c`` lists them."""
    if pid is None:
        return None
    try:
        return format_cpu_list(os.sched_getaffinity(pid))
    except OSError:  # it exited since the supervisor's last look
        return None


def _struct(stats: Any) -> dict[str, Any]:
    return {name: getattr(stats, name) for name in stats.__struct_fields__}


async def metrics(front: Front, ex: Exchange) -> None:
    await ex.respond(200, front.metrics.render(), CONTENT_TYPE)


async def abort_request(front: Front, ex: Exchange, body: bytes) -> None:
    req = parse(AbortRequest, body)
    if req.abort_all:
        await ex.json({"aborted": front.abort_all()})
        return
    if not req.rid:
        raise HTTPError(
            400, "rid: expected the rid of a request in flight, or abort_all=true", param="rid"
        )
    # none in flight is 200 too, as SGLang's: a client that aborts on its timeout races
    # the request's end, and an error for the one that just ended would fail its call
    await ex.json({"aborted": front.abort(req.rid)})


async def flush_cache(front: Front, ex: Exchange, body: bytes = b"") -> None:
    if body.strip():  # (a body is optional, but one that is sent is read: a typo is a 400)
        parse(FlushCacheRequest, body)
    try:
        flushed = await front.engine.flush_cache()
    except errors.RtError as err:
        raise http_error(err) from err
    if not flushed:
        raise HTTPError(400, "the cache was not flushed: requests are running; retry when idle")
    await ex.json({"status": "ok"})


async def pause_generation(front: Front, ex: Exchange, body: bytes) -> None:
    """SGLang's: no body (or mode ``abort``) aborts what is in flight as well
    (RL trainers pause, flush, load weights, continue)."""
    req = parse(PauseRequest, body) if body.strip() else PauseRequest()
    if front.stopping:  # the drain resumed generation so that what is in flight can finish
        raise HTTPError(503, "the server is shutting down: generation cannot be paused now")
    try:
        await front.engine.pause_generation(retract=req.mode == "retract")
    except errors.RtError as err:
        raise http_error(err) from err
    if front.stopping:  # a drain began while the pause waited (for a restart): it won
        raise HTTPError(503, "the server is shutting down: generation was not paused")
    answer: dict[str, Any] = {"status": "ok", "paused": True, "mode": req.mode}
    if req.mode == "abort":  # (paused first: nothing new starts in between)
        answer["aborted"] = front.abort_all("pause_generation")
    await ex.json(answer)


async def continue_generation(front: Front, ex: Exchange, body: bytes = b"") -> None:
    if body.strip():
        parse(ContinueRequest, body)
    try:
        await front.engine.continue_generation()
    except errors.RtError as err:
        raise http_error(err) from err
    await ex.json({"status": "ok", "paused": False})

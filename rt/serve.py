"""rt-serve: serve a model over HTTP (SGLang's native API, the OpenAI API, a
WebSocket API, health, metrics and admin endpoints).

With no --model-path it serves the small model shipped in the package. Flags
follow SGLang's launch_server names where one exists. SIGINT, SIGTERM or SIGHUP: new
requests get 503, requests in flight finish (at most --drain-timeout
seconds), then everything stops and the command exits 0.
"""

from __future__ import annotations

import argparse
import logging
import resource
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio

from rt import errors
from rt.actors.affinity import format_cpu_list, pin_process, split_cpus
from rt.actors.faultplan import FaultPlan
from rt.config import EngineOptions
from rt.frontend.drain import SIGNALS
from rt.frontend.wiring import supervisor_spec
from rt.http.flags import add_server_flags, http_settings
from rt.http.settings import Settings

log = logging.getLogger("rt.serve")
FD_TARGET = 65536  # the soft limit of open files asked for (SGLang's)
PROGRESS_EVERY_S = 5.0
READY = "rt-serve ready on %s"  # the one line a caller waits for (tests, scripts)
EXIT_ESCALATED = 3  # as rt.actors.main.run_main


@dataclass(frozen=True)
class Flag:
    """One engine option as a command-line flag."""

    name: str
    option: str
    type: Any
    help: str
    choices: tuple[str, ...] | None = None


ENGINE_FLAGS = (
    Flag(
        "--model-path",
        "model_path",
        str,
        "a Hugging Face model directory (default: the shipped model)",
    ),
    Flag(
        "--tokenizer-path",
        "tokenizer_path",
        str,
        "the tokenizer's directory (default: --model-path)",
    ),
    Flag(
        "--chat-template",
        "chat_template",
        str,
        "a chat template for /v1/chat/completions: a Jinja file, or the template itself "
        "(default: the tokenizer's own)",
    ),
    Flag(
        "--load-format",
        "load_format",
        str,
        "auto: the weights; dummy: random weights; null: no forward pass, fixed tokens",
        ("auto", "dummy", "null"),
    ),
    Flag(
        "--dtype",
        "dtype",
        str,
        "the weights' and activations' dtype; auto (the default): float32 on the CPU, on "
        "CUDA the checkpoint's bfloat16 or float16 (float16 for a float32 checkpoint)",
        ("auto", "float32", "bfloat16", "float16"),
    ),
    Flag(
        "--device",
        "device",
        str,
        "auto (the default): cuda if torch sees a CUDA device, else cpu; or cpu, cuda, cuda:1, …",
    ),
    Flag(
        "--context-length",
        "context_length",
        int,
        "the model's context length (default: from config.json)",
    ),
    Flag(
        "--max-total-tokens",
        "max_total_tokens",
        int,
        "KV pool size in tokens (default: from --mem-fraction-static)",
    ),
    Flag("--mem-fraction-static", "mem_fraction", float, "share of free memory the KV pool takes"),
    Flag("--page-size", "page_size", int, "tokens per KV page"),
    Flag(
        "--chunked-prefill-size",
        "chunked_prefill_size",
        int,
        "the most prompt tokens one step prefills (default: 8192 on CUDA, 2048 on the CPU; "
        "-1: no chunking)",
    ),
    Flag(
        "--torch-threads",
        "torch_threads",
        int,
        "torch's threads in the scheduler (default: one per core; 1 on a shared, loaded host)",
    ),
    Flag(
        "--scheduler-cpus",
        "scheduler_cpus",
        str,
        "pin the scheduler to these CPUs (e.g. 1, or 2-7) and the rest of the server to the "
        "other CPUs; for a host the server has to itself (default: no pinning)",
    ),
    Flag(
        "--max-running-requests",
        "max_running_requests",
        int,
        "requests in the running batch at most",
    ),
    Flag("--max-prefill-tokens", "max_prefill_tokens", int, "prefill tokens per step at most"),
    Flag(
        "--schedule-policy",
        "schedule_policy",
        str,
        "the waiting queue's order",
        ("fcfs", "lpm", "priority"),
    ),
    Flag(
        "--attention-backend",
        "attention_backend",
        str,
        "torch (reference; the CPU's default), triton (Triton kernels; CUDA's default, "
        "interpreted on CPU), flashinfer (CUDA)",
        ("torch", "triton", "flashinfer"),
    ),
    Flag(
        "--cuda-graph-max-bs",
        "cuda_graph_max_bs",
        int,
        "the largest decode batch a CUDA graph is captured for",
    ),
    Flag(
        "--torch-compile-max-bs",
        "torch_compile_max_bs",
        int,
        "the largest decode batch --enable-torch-compile compiles",
    ),
    Flag("--random-seed", "seed", int, "the engine's seed (model init for dummy weights)"),
    Flag(
        "--sampling-defaults",
        "sampling_defaults",
        str,
        "model: sampling parameters a request leaves out take the model's "
        "generation_config.json values (temperature, top_p, top_k, min_p, repetition_penalty), "
        "as SGLang and vLLM do; openai: the API's defaults (temperature 1, top_p 1)",
        ("model", "openai"),
    ),
    Flag("--tokenizer-worker-num", "tokenizer_workers", int, "tokenizer processes"),
    Flag(
        "--tokenizer-batch-size", "tokenizer_batch_size", int, "prompts per tokenizer call at most"
    ),
    Flag(
        "--tokenizer-batch-wait-ms",
        "tokenizer_batch_wait_ms",
        float,
        "how long a tokenizer waits to fill a batch",
    ),
    Flag(
        "--watchdog-timeout",
        "watchdog_timeout",
        float,
        "seconds without a heartbeat before an actor is killed and restarted (a chat "
        "template's render is stopped, and its request refused, at a quarter of it, 2 s at most)",
    ),
    Flag(
        "--shutdown-grace",
        "shutdown_grace",
        float,
        "seconds an actor gets to exit on SIGTERM before SIGKILL",
    ),
    Flag(
        "--max-restarts",
        "max_restarts",
        int,
        "restarts allowed within --restart-window before the server gives up (exit 3)",
    ),
    Flag("--restart-window", "restart_window", float, "the window of --max-restarts, in seconds"),
    Flag(
        "--max-crashes-per-request",
        "max_crashes_per_request",
        int,
        "crashes of one actor (the scheduler, or a tokenizer worker) a request may be in "
        "flight for before it fails alone",
    ),
    Flag(
        "--restart-wait-timeout",
        "restart_wait_timeout",
        float,
        "how long a new request waits for a restarting actor (then 503)",
    ),
    Flag(
        "--drain-timeout",
        "drain_timeout",
        float,
        "on SIGTERM/SIGINT/SIGHUP, how long requests in flight may take to finish",
    ),
    Flag(
        "--stall-timeout",
        "stall_timeout",
        float,
        "seconds without news before a request is sent again (doubling each time; 0: never)",
    ),
    Flag("--fault-plan", "fault_plan", str, "a fault plan (JSON or TOML) for chaos testing"),
    Flag("--ring-capacity", "ring_capacity", int, "bytes per shared-memory ring"),
    Flag(
        "--max-logprobs",
        "max_logprobs",
        int,
        "the most top logprobs per token a request may ask for",
    ),
)
SWITCHES = {
    "--disable-radix-cache": ("enable_prefix_cache", False, "no prefix cache"),
    "--enable-deterministic-inference": (
        "deterministic",
        True,
        "batch-invariant kernels: outputs do not depend on the batch (implies the triton backend)",
    ),
    "--disable-overlap-schedule": (
        "overlap_schedule",
        False,
        "read each step's tokens before launching the next (default on the CPU)",
    ),
    "--enable-overlap-schedule": (
        "overlap_schedule",
        True,
        "launch each step before reading the last one's tokens (default on CUDA)",
    ),
    "--enable-torch-compile": (
        "torch_compile",
        True,
        "run decode steps through torch.compile (inductor; --attention-backend torch): "
        "faster on a CPU, after ~10 s of compiling per batch size at start-up",
    ),
    "--disable-cuda-graph": (
        "cuda_graph",
        False,
        "run decode steps eagerly (by default they replay CUDA graphs where they can run: "
        "CUDA, --attention-backend triton, not deterministic)",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rt-serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    server = add_server_flags(parser)
    server.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log verbosity (default: %(default)s)",
    )
    engine = parser.add_argument_group("engine")
    defaults = EngineOptions.model_fields
    for flag in ENGINE_FLAGS:
        default = defaults[flag.option].default
        engine.add_argument(
            flag.name,
            dest=flag.option,
            metavar=None if flag.choices else flag.name[2:].upper().replace("-", "_"),
            type=flag.type,
            choices=flag.choices,
            default=None,
            help=flag.help if default is None else f"{flag.help} (default: {default})",
        )
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for name, (option, value, text) in SWITCHES.items():
        # switches that set the same option exclude each other
        shared = [n for n, (o, _, _) in SWITCHES.items() if o == option]
        target: Any = engine
        if len(shared) > 1:
            if option not in groups:
                groups[option] = engine.add_mutually_exclusive_group()
            target = groups[option]
        target.add_argument(
            name, dest=option, action="store_const", const=value, default=None, help=text
        )
    return parser


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    names = [f.option for f in ENGINE_FLAGS] + list({o: None for o, _, _ in SWITCHES.values()})
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


async def serve(options: dict[str, Any], settings: Settings) -> None:
    import rt
    from rt.http import serve as serve_http

    started = time.monotonic()
    checked = EngineOptions.build(**options)
    log.info(
        "starting the engine: model %s on %s (%s), %d tokenizer worker(s)",
        checked.resolved_model_path(),
        checked.device,
        checked.dtype,
        checked.tokenizer_workers,
    )
    # SIGTERM, SIGINT and SIGHUP are the engine's while it runs (503, drain, stop). Before
    # it is up they cancel the start-up; after its drain they are ignored, so that
    # a second one cannot kill the process before its children and segments are gone.
    with trio.open_signal_receiver(*SIGNALS) as signals:
        if _outside:
            log.warning("%s: stopping before the start-up", _outside[0])
            return
        async with trio.open_nursery() as nursery:
            state: dict[str, Any] = {"engine": None}
            nursery.start_soon(_outer_signals, signals, nursery.cancel_scope, state)
            ticker = trio.CancelScope()
            nursery.start_soon(_progress, ticker, started)
            async with rt.open_engine(**options) as engine:
                state["engine"] = engine
                ticker.cancel()
                actors = ", ".join(f"{a.name} (pid {a.pid})" for a in engine.actors())
                log.info("engine up in %.1f s: %s", time.monotonic() - started, actors)
                if checked.scheduler_cpus is not None:
                    mine, rest = split_cpus(checked.scheduler_cpus)
                    pin_process(rest)  # the front: off the scheduler's CPUs, as its actors
                    log.info(
                        "pinned: the scheduler to CPUs %s, the front and the other actors to %s",
                        format_cpu_list(mine),
                        format_cpu_list(rest),
                    )
                async with trio.open_nursery() as server:
                    address = await server.start(serve_http, engine, settings)
                    # whatever --log-level: with --port 0, the one place the port is told
                    log.log(max(logging.INFO, log.getEffectiveLevel()), READY, address)
            log.info("stopped%s", f" by {engine.stopped_by}" if engine.stopped_by else "")
            nursery.cancel_scope.cancel()


async def _outer_signals(signals: Any, startup: trio.CancelScope, state: dict[str, Any]) -> None:
    async for signum in signals:
        name = signal.Signals(signum).name
        engine = state["engine"]
        if engine is None or engine.stopped_by is None:  # not the engine's to handle (yet)
            log.warning("%s: stopping", name)
            startup.cancel()
        else:
            log.warning("%s: already stopping", name)


async def _progress(scope: trio.CancelScope, started: float) -> None:
    with scope:
        while True:
            await trio.sleep(PROGRESS_EVERY_S)
            log.info(
                "still starting (%.0f s): spawning actors, loading the model",
                time.monotonic() - started,
            )


def main(argv: list[str] | None = None, early: Sequence[str] = ()) -> int:
    """``early``: the signals rt.launch took before this ran."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    raise_fd_limit()
    _outside.clear()
    previous = {signum: signal.signal(signum, _remember) for signum in SIGNALS}
    _outside.extend(early)  # (after: one that came in between is in ``early`` by now)
    try:
        options = engine_options(args)
        checked = EngineOptions.build(**options)
        checked.model_limits()  # no config.json there, a context past the model's
        checked.check_model_dir()  # a model rt cannot build (architecture, shapes, EOS)
        checked.model_sampling_defaults()  # generation_config.json's, if no request could take them
        checked.check_device()  # CUDA asked for on a host without it
        checked.engine_config()  # options the engine core refuses (torch.compile on CUDA)
        checked.check_tokenizer()  # another model's
        checked.chat_template_text()  # a file that is not there, a template that cannot compile
        if checked.scheduler_cpus is not None:
            split_cpus(checked.scheduler_cpus)  # a CPU this process may not run on
        # a plan (--fault-plan's, or RT_FAULT_PLAN's) that cannot be read or parsed, or
        # names an actor or a point there is not (it exited 1, the engine begun)
        plan = checked.fault_plan
        if isinstance(plan, str):
            plan = FaultPlan.load(plan)
        elif plan is None:
            try:
                plan = FaultPlan.from_env()
            except errors.ConfigError as err:  # (said where it came from: no flag gave it)
                raise errors.ConfigError(f"RT_FAULT_PLAN: {err}") from None
        if plan is not None:
            plan.check_actors(supervisor_spec(checked).actors())
        settings = http_settings(args)
        check_address(settings.host, settings.port)
    except errors.ConfigError as err:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        parser.error(str(err))
    try:
        trio.run(serve, options, settings)
    except (errors.RtError, BaseExceptionGroup) as err:
        cause = _rt_error(err)
        if cause is None:
            raise
        refused = cause.__cause__
        if isinstance(refused, errors.ActorStartupError) and refused.refused:
            log.error("could not start: %s", str(refused).partition("\n")[0])
            return 2  # as a flag refused before the start: the configuration is the fault
        log.error(
            "%s: %s",
            "gave up" if isinstance(cause, errors.EscalationError) else "could not start",
            cause,
        )
        return EXIT_ESCALATED if isinstance(cause, errors.EscalationError) else 1
    finally:
        _ignore_signals()
    return 0


def raise_fd_limit(target: int = FD_TARGET) -> None:
    """Each connection holds an fd: rt-serve raises the soft limit toward the hard
    one (as SGLang and vLLM do), so that a thousand clients do not exhaust a
    default 1024 (what the engine does when they do: docs/architecture.md)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        log.debug("open files: soft limit %d -> %d (hard %s)", soft, want, hard)


def check_address(host: str, port: int) -> None:
    """Bind the address once before the engine starts (minutes, for a big
    model), so that a port in use or a host not this machine's is a line now,
    not a traceback then. (Released at once; hypercorn binds it again.)"""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as hypercorn's
            sock.bind(address)
    except OSError as err:
        raise errors.ConfigError(
            f"--host {host} --port {port}: cannot bind it ({err.strerror or err})"
        ) from None


_outside: list[str] = []  # the signals that came while no trio receiver had them


def _remember(signum: int, frame: Any) -> None:
    """SIGTERM, SIGINT and SIGHUP outside the run's receivers: before one opens (serve
    then stops at once), and as the last closes, where it redelivers one that
    came while the engine was stopping (a supervisor repeating itself); that must
    not turn a clean exit into death by signal."""
    _outside.append(signal.Signals(signum).name)


def _ignore_signals() -> None:
    """Everything is stopped and unlinked: ignored from here on, as the
    interpreter's exit puts back the default action of a Python handler."""
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def _rt_error(err: BaseException) -> errors.RtError | None:
    """The rt error behind ``err`` (trio wraps what tasks raise in groups)."""
    if isinstance(err, errors.RtError):
        return err
    if isinstance(err, BaseExceptionGroup):
        for inner in err.exceptions:
            found = _rt_error(inner)
            if found is not None:
                return found
    return None


if __name__ == "__main__":
    sys.exit(main())

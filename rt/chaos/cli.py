"""rt-chaos: drive load through an rt engine while faults fire; check the ledger.

    rt-chaos --duration 10m --seed 7                # starts rt-serve, SSE + WebSocket load
    rt-chaos --url http://127.0.0.1:30000 --duration 5m   # a running rt-serve (signals only)
    rt-chaos --in-process --requests 60             # rt.open_engine in this process
    rt-chaos --replay 7 --faults 3,9                # a run again, with only faults 3 and 9

Exit status: 0 when every checker passed, 1 when one failed (the report
then ends with the shortest fault schedule that still fails) or when no
planned fault fired (INCONCLUSIVE: the run tested nothing), 2 for a usage
error (or a server attached to that cannot take the run asked for), 130 when
Ctrl-C ended the run (no verdict). Attached to a server (``--url``), the faults
are spread out to fit its ``--max-restarts`` in ``--restart-window``; a schedule
that would still restart its actors past it is refused before it starts
(rt/chaos/attach.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import trio
from pydantic import ValidationError

from rt.chaos.attach import AttachError
from rt.chaos.campaign import CampaignConfig, Outcome, campaign
from rt.chaos.run import RunConfig
from rt.chaos.schedule import (
    KINDS,
    MAIN_KINDS,
    PHASES,
    POINTS,
    SIGNAL_KINDS,
    Schedule,
    ScheduleConfig,
    role,
)
from rt.chaos.workload import WorkloadConfig
from rt.config import EngineOptions
from rt.errors import ConfigError


def duration(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|m|h)?", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a duration like 90s, 10m or 1h, got {text!r}")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]


def bounded(lo: float, hi: float) -> Callable[[str], float]:
    """An argparse type: a number in [lo, hi]."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected a number in [{lo:g}, {hi:g}], got {text}")
        return value

    return parse


def value_range(cast: Callable[[str], Any], least: float, what: str) -> Callable[[str], Any]:
    """An argparse type: ``LO,HI`` (or one number), each ``cast``, ``least <= LO <= HI``."""

    def parse(text: str) -> tuple[Any, Any]:
        parts = text.split(",")
        try:
            if len(parts) > 2:
                raise ValueError
            lo, hi = cast(parts[0]), cast(parts[-1])
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected LO,HI ({what}), got {text!r}") from None
        if not least <= lo <= hi:
            raise argparse.ArgumentTypeError(f"expected {least:g} <= LO <= HI, got {text!r}")
        return lo, hi

    return parse


token_range = value_range(int, 1, "integers")  # output lengths
seconds_range = value_range(float, 0, "seconds")


def listed(choices: tuple[str, ...] | None = None) -> Any:
    """An argparse type: a comma-separated list of at least one of ``choices`` (None:
    actor names, a role of POINTS with a number for a tokenizer). An empty list drew
    faults from an empty deck for ever, before a line was printed."""

    def known(x: str) -> bool:
        if choices is not None:
            return x in choices
        if role(x) != "tokenizer":
            return x in POINTS
        number = x[len("tokenizer") :]
        return number.isdigit() and x == f"tokenizer{int(number)}"  # (not tokenizer01)

    def parse(text: str) -> tuple[str, ...]:
        items = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [x for x in items if not known(x)]
        expected = ", ".join(choices) if choices else "tokenizer0 (…N), scheduler, detokenizer"
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"{f'unknown {bad}' if bad else 'none given'}; expected some of {expected}"
            )
        return items

    return parse


def at_least(least: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rt-chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    target = p.add_argument_group("target").add_mutually_exclusive_group()
    target.add_argument(
        "--url", help="attach to a running rt-serve (same host: its pids are signalled)"
    )
    target.add_argument("--in-process", action="store_true", help="rt.open_engine in this process")
    load = p.add_argument_group("load")
    load.add_argument("--duration", type=duration, help="send requests for this long (90s, 10m)")
    load.add_argument(
        "--requests",
        type=at_least(1),
        help="send this many requests (default 60 with no --duration)",
    )
    load.add_argument(
        "--until-faults", action=argparse.BooleanOptionalAction, default=True,
        help="with --requests: go on past them (up to 4 times as many) until every "
        "signal fault was tried (default on)",
    )  # fmt: skip
    load.add_argument("--concurrency", type=at_least(1), help="requests in flight (default 8)")
    load.add_argument("--transports", type=listed(("sse", "ws")), default=("sse", "ws"),
                      help="over HTTP: sse, ws (default both)")  # fmt: skip
    load.add_argument(
        "--hostile",
        type=bounded(0.0, 1.0),
        default=0.05,
        help="share of invalid and fuzzed requests",
    )
    load.add_argument(
        "--cancel", type=bounded(0.0, 1.0), default=0.1, help="share of requests cancelled midway"
    )
    load.add_argument(
        "--timeout",
        type=bounded(0.1, 86400.0),
        default=180.0,
        help="seconds before a request counts as hung",
    )
    load.add_argument("--max-tokens", type=token_range, default=(8, 40), metavar="LO,HI",
                      help="each request's max_new_tokens, drawn in [LO, HI] (default 8,40)")  # fmt: skip
    load.add_argument(
        "--hogs", type=at_least(0), default=0, help="CPU hog processes beside the engine"
    )
    load.add_argument("--seeded", type=bounded(0.0, 1.0), default=0.5, metavar="SHARE",
                      help="share of seeded (sampled) requests; the others are greedy (default 0.5)")  # fmt: skip
    load.add_argument("--temperature", type=bounded(0.0, 10.0), default=0.8,
                      help="the seeded requests' temperature (top_p 0.95; default 0.8): hotter "
                      "sampling makes near-ties, where a re-prefill's other numbers change a "
                      "token, likelier")  # fmt: skip
    faults = p.add_argument_group("faults")
    faults.add_argument("--seed", type=int, default=1)
    faults.add_argument("--replay", type=int, metavar="SEED", help="run seed SEED again, exactly")
    faults.add_argument("--faults", help="replay only these fault ids (3,9; 'none' for none)")
    faults.add_argument("--schedule", help="run this schedule (JSON, as --json prints it) instead")
    faults.add_argument("--backlog-s", type=seconds_range, default=(0.02, 0.3), metavar="LO,HI",
                        help="how long the reader is stopped before a backlog-phase fault, drawn "
                        "in [LO, HI] seconds: the longer, the more tokens a killed scheduler's "
                        "successor computes again (default 0.02,0.3)")  # fmt: skip
    faults.add_argument(
        "--fault-count", type=at_least(0), help="faults to draw (default: from the load's size)"
    )
    faults.add_argument("--kinds", type=listed(KINDS), default=MAIN_KINDS,
                        help=f"default {','.join(MAIN_KINDS)}; all: {','.join(KINDS)}")  # fmt: skip
    faults.add_argument("--phases", type=listed(PHASES), default=PHASES)
    faults.add_argument(
        "--actors", type=listed(), default=("tokenizer0", "scheduler", "detokenizer")
    )
    faults.add_argument(
        "--poison",
        type=at_least(0),
        default=3,
        help="poison requests (a flood), each its own marker",
    )
    faults.add_argument("--sweep", type=at_least(0), default=0, metavar="K",
                        help="also SIGKILL each of --actors at each of its first K receive, "
                        "send and commit hits, one incarnation after another (with --concurrency 1: every "
                        "frame boundary of a request's life)")  # fmt: skip
    faults.add_argument(
        "--shrink-budget",
        type=at_least(0),
        default=12,
        help="replays to shrink a failure (0: none)",
    )
    engine = p.add_argument_group("engine")
    engine.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    engine.add_argument(
        "--ring-capacity", type=at_least(1), help="bytes per ring (small: senders meet full rings)"
    )
    engine.add_argument("--watchdog-timeout", type=bounded(0.1, 3600.0), default=4.0)
    engine.add_argument(
        "--max-restarts", type=at_least(0), help="default: enough for the schedule's faults"
    )
    engine.add_argument("--model-path")
    engine.add_argument("--load-format", choices=("auto", "dummy", "null"),
                        help="null: no forward pass (fixed tokens): the runtime alone")  # fmt: skip
    engine.add_argument("--tokenizer-workers", type=at_least(1))
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    out.add_argument(
        "--log-dir", default="chaos-logs", help="ledgers and logs (default ./chaos-logs)"
    )
    out.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def configure(args: argparse.Namespace) -> CampaignConfig:
    seed = args.replay if args.replay is not None else args.seed
    concurrency = args.concurrency or 8
    requests = args.requests if args.requests is not None or args.duration else 60
    mode = "attach" if args.url else "engine" if args.in_process else "server"
    transports = ("engine",) if mode == "engine" else args.transports
    workload = WorkloadConfig(
        transports=transports,
        max_tokens=args.max_tokens,
        seeded_share=args.seeded,
        seeded_temperature=args.temperature,
        cancel_share=args.cancel,
        invalid_share=args.hostile / 2,
        fuzz_share=0.0 if mode == "engine" else args.hostile / 2,
    )
    size = requests or int((args.duration or 60) * 1.5)  # requests, roughly
    # a fault every 15 s or so (a scheduler takes seconds to come back), or per 5 requests
    drawn = int(args.duration / 15) if args.duration else size // 5
    count = args.fault_count if args.fault_count is not None else max(8, min(200, drawn))
    workers = args.tokenizer_workers or 1
    # (the engine refused such an actor's plan at its start: "the engine gave up", a FAIL;
    # a running server's own count is its to say)
    absent = [
        a for a in args.actors if role(a) == "tokenizer" and int(a[len("tokenizer") :]) >= workers
    ]
    if absent and mode != "attach":
        raise UsageError(
            f"--actors: {', '.join(absent)}: the engine runs {workers} tokenizer worker(s) "
            f"(tokenizer0 … tokenizer{workers - 1}); --tokenizer-workers sets how many"
        )
    kinds, poison = args.kinds, args.poison
    if mode == "attach":  # a running rt-serve has no fault plan of ours: signals only
        kinds = tuple(k for k in kinds if k in SIGNAL_KINDS)
        if not kinds:  # (they were replaced by the signals, unsaid)
            raise UsageError(
                f"--kinds: attached to a server (--url), only signals can be sent: "
                f"{', '.join(SIGNAL_KINDS)}; got {', '.join(args.kinds)}"
            )
        poison = 0
    sched = ScheduleConfig(
        actors=args.actors,
        kinds=kinds,
        phases=args.phases
        if mode != "attach"
        else tuple(p for p in args.phases if p != "shutdown"),
        faults=count,
        poison=poison,
        signal_share=1.0 if mode == "attach" else 0.5,
        # steps: a request's tokens, shared by the requests in flight
        frames=max(20, size * sum(workload.max_tokens) // 2 // concurrency),
        watchdog_s=args.watchdog_timeout,
        backlog_s=args.backlog_s,
        sweep=args.sweep,
        sweep_actors=args.actors,
    )
    options: dict[str, Any] = {
        "dtype": args.dtype,
        "watchdog_timeout": args.watchdog_timeout,
        "max_restarts": args.max_restarts
        if args.max_restarts is not None  # (0 was taken for none given)
        else 2 * (count + poison) + 9 * args.sweep + 5,
        "max_total_tokens": 1 << 15,
    }
    for name in ("ring_capacity", "model_path", "tokenizer_workers", "load_format"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    run = RunConfig(
        seed=seed,
        mode=mode,
        url=args.url,
        requests=requests,
        duration=args.duration,
        concurrency=concurrency,
        timeout=args.timeout,
        workload=workload,
        engine=options,
        hogs=args.hogs,
        log_dir=args.log_dir,
        until_faults=args.until_faults,
    )
    only = None
    if args.faults is not None:
        try:
            only = () if args.faults == "none" else tuple(int(x) for x in args.faults.split(","))
        except ValueError:
            raise UsageError(
                f"--faults: expected ids (3,9) or 'none', got {args.faults!r}"
            ) from None
    plan = None
    if args.schedule:
        try:
            with open(args.schedule) as f:
                data = json.load(f)
            plan = Schedule.from_json(data.get("schedule_json", data))
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
            raise UsageError(
                f"--schedule: {args.schedule} is no schedule (as --json prints it): {err!r}"
            ) from None
        run = replace(run, seed=plan.seed)
    if mode != "attach":  # (options the engine refuses: a usage error, not its failure)
        try:  # (validated as given: resolving 'auto' would import torch here)
            EngineOptions(**options).model_limits()  # (and a model there: config.json)
        except ValidationError as err:
            said = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            raise UsageError(f"invalid engine options: {said}") from None
        except ConfigError as err:  # (a model path with no model: the engine's "FAIL")
            raise UsageError(str(err)) from None
    return CampaignConfig(run, sched, shrink_budget=args.shrink_budget, only=only, plan=plan)


class UsageError(Exception):
    """What the command line asks for cannot run: exit 2 with the message."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = configure(args)
    except UsageError as err:
        parser.error(str(err))
    config = replace(config, argv=tuple(sys.argv[1:] if argv is None else argv))

    def say(line: str) -> None:
        if not args.quiet:
            print(f"rt-chaos: {line}", file=sys.stderr, flush=True)

    try:
        outcome: Outcome = trio.run(campaign, config, say)
    except AttachError as err:  # (a server that cannot take the run asked for)
        print(f"rt-chaos: error: {err}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, BaseExceptionGroup) as err:  # (Ctrl-C: no verdict, no
        # traceback; 1 is a checker's failure)
        stop = err if isinstance(err, KeyboardInterrupt) else err.subgroup(KeyboardInterrupt)
        if stop is None:
            raise
        while isinstance(stop, BaseExceptionGroup):
            stop = stop.exceptions[0]
        said = f" ({stop.args[0]})" if stop.args else ""
        print(f"rt-chaos: interrupted{said}: no verdict", file=sys.stderr)
        return 130
    from rt.chaos.report import inconclusive, render, summary

    if args.json:
        data = summary(outcome)
        data["schedule_json"] = outcome.schedule.to_json()
        print(json.dumps(data, indent=2))
    else:
        print(render(outcome))
    return 1 if outcome.verdict.failed or inconclusive(outcome) else 0

"""A seeded, randomized fault run through ``rt.open_engine``.

    python tools/fault_run.py --requests 300 --seed 1 [--dtype bfloat16] [--json]

The seed draws a fault plan: SIGKILLs of each actor at random frames (the
points it passes: receive, send, tokenize, step, forward), one per
incarnation, so they fire one after another while the load runs. The load is
N requests (greedy and seeded, streamed, some cancelled after a few chunks)
at a fixed concurrency, run once without faults (the reference) and once
with them, on the shipped default model. Reported:

* lost: a request with no terminal state; hung: past ``--timeout``;
* failed: a request that raised (with the reasons);
* diverged (float32): a completed output that differs from the reference;
* replay_differs (bfloat16): a resumed output that differs from the engine
  core alone resumed from the same prefix (``Completion.resumed_from``). New
  requests wait while the frontend isolates suspects, but after a first
  crash the suspects resume together, and in bfloat16 the batch a request
  shares changes its logits: a difference here is a lead to look at (where
  did it first differ?), not proof of a splice;
* restarts per actor, escalation, and what the actors still hold at the end.

The same seed replays the same plan and the same requests.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rt
from rt.assets import default_model_path
from rt.errors import RtError

POINTS = {
    "tokenizer0": ("receive", "send", "tokenize"),
    "scheduler": ("receive", "send", "step", "forward"),
    "detokenizer": ("receive", "send"),
}
HITS = {"tokenizer0": 60, "scheduler": 200, "detokenizer": 300}  # a kill lands in [1, HITS]
TEXT = (
    "In the beginning God created the heaven and the earth. And the earth was "
    "without form, and void; and darkness was upon the face of the deep."
)
WORDS = re.findall(r"\w+", TEXT)


@dataclass
class Req:
    index: int
    prompt: str
    options: dict[str, Any]
    cancel_after: int | None  # chunks, or None: run to the end


@dataclass
class Result:
    state: str = "lost"  # completed | cancelled | failed | hung | lost
    ids: list[int] = field(default_factory=list)
    resumed_from: tuple[int, ...] = ()
    error: str = ""


def draw_requests(rng: random.Random, n: int) -> list[Req]:
    reqs = []
    for i in range(n):
        words = rng.sample(WORDS, rng.randint(3, 12))
        options: dict[str, Any] = dict(max_new_tokens=rng.randint(8, 48), ignore_eos=True)
        if rng.random() < 0.5:
            options["temperature"] = 0.0
        else:
            options.update(temperature=0.8, top_p=0.95, seed=rng.randrange(1 << 31))
        cancel = rng.randint(1, 5) if rng.random() < 0.1 else None
        reqs.append(Req(i, " ".join(words), options, cancel))
    return reqs


def draw_plan(rng: random.Random, kills: int) -> dict[str, Any]:
    rules = []
    for actor, points in POINTS.items():
        for incarnation in range(1, kills + 1):
            rules.append(
                {
                    "actor": actor,
                    "point": rng.choice(points),
                    "action": "sigkill",
                    "after": rng.randint(1, HITS[actor]) - 1,
                    "incarnation": incarnation,
                }
            )
    return {"seed": rng.randrange(1 << 31), "faults": rules}


async def drive(
    engine: rt.Engine, reqs: list[Req], concurrency: int, timeout: float, hold: bool
) -> list[Result]:
    results = [Result() for _ in reqs]
    limit = trio.Semaphore(concurrency)

    async def one(req: Req) -> None:
        result = results[req.index]
        chunks = 0
        try:
            with trio.fail_after(timeout):
                while hold and engine.table.isolating:
                    await trio.sleep(0.01)  # let the suspects be isolated alone
                if req.cancel_after is None:
                    out = await engine.generate(req.prompt, **req.options)
                    result.ids = list(out.output_ids)
                    result.resumed_from = out.choices[0].resumed_from
                else:
                    async for chunk in engine.stream(req.prompt, **req.options):
                        result.ids += chunk.output_ids
                        chunks += 1
                        if chunks >= req.cancel_after:
                            result.state = "cancelled"
                            return
            result.state = "completed"
        except trio.TooSlowError:
            result.state = "hung"
        except RtError as err:
            result.state, result.error = "failed", f"{type(err).__name__}: {err}"
        finally:
            limit.release()

    async with trio.open_nursery() as nursery:
        for req in reqs:
            await limit.acquire()
            nursery.start_soon(one, req)
    return results


async def run(
    reqs: list[Req], options: dict[str, Any], concurrency: int, timeout: float, hold: bool
) -> tuple[list[Result], dict[str, Any]]:
    info: dict[str, Any] = {"escalated": None}
    results: list[Result] = []
    try:
        async with rt.open_engine(**options) as engine:
            results = await drive(engine, reqs, concurrency, timeout, hold)
            with trio.move_on_after(30):
                detok = await engine.detokenizer_stats(lambda s: s.streams == 0 and s.parked == 0)
                sched = await engine.scheduler_stats(
                    lambda s: s.running == 0 and s.waiting == 0 and s.requests == 0
                )
                info["held_at_end"] = {
                    "detok_streams": detok.streams,
                    "detok_parked": detok.parked,
                    "scheduler_requests": sched.requests,
                    "kv_tokens_held": sched.request_tokens,
                }
            info["restarts"] = {a.name: a.restart_count for a in engine.actors()}
    except BaseException as err:  # an escalation comes out as an exception group
        info["escalated"] = f"{type(err).__name__}: {str(err)[:300]}"
    return results, info


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where ``a`` and ``b`` differ (or the shorter one ends)."""
    return next(
        (j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def replay(reqs: list[Req], results: list[Result], dtype: str) -> list[int]:
    """Indexes of resumed outputs that the engine core alone, resumed from the same
    prefix, does not reproduce."""
    from rt.gpu import EngineConfig, EngineCore, SamplingParams
    from rt.tok.load import load_tokenizer

    model = default_model_path()
    tokenizer = load_tokenizer(str(model))
    core = EngineCore(EngineConfig(model_path=model, dtype=dtype, max_total_tokens=1 << 15))
    bad = []
    for req, result in zip(reqs, results, strict=True):
        if result.state != "completed" or not any(result.resumed_from):
            continue
        k = result.resumed_from[-1]
        core.add_request(
            str(req.index),
            tokenizer(req.prompt)["input_ids"],
            SamplingParams(**req.options),
            output_ids=[result.ids[:k]],
        )
        again: list[int] = []
        while core.has_work:
            for o in core.step().outputs:
                again += o.token_ids
        if again != result.ids[k:]:
            bad.append(req.index)
            print(
                "replay differs: request",
                req.index,
                "k",
                k,
                result.resumed_from,
                "len",
                len(result.ids),
                len(again) + k,
                "first diff",
                first_difference(again, result.ids[k:]),
                file=sys.stderr,
            )
    return bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kills", type=int, default=3, help="kills per actor")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--timeout", type=float, default=180.0, help="per request, seconds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    reqs = draw_requests(rng, args.requests)
    fault_plan = draw_plan(rng, args.kills)
    base: dict[str, Any] = dict(dtype=args.dtype, max_total_tokens=1 << 15, max_restarts=50)
    bf16 = args.dtype == "bfloat16"

    start = time.monotonic()
    reference: list[Result] = []
    if not bf16:
        reference, _ = trio.run(run, reqs, base, args.concurrency, args.timeout, False)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(fault_plan, f)
        f.flush()
        faulted, info = trio.run(
            run, reqs, {**base, "fault_plan": f.name}, args.concurrency, args.timeout, bf16
        )
    states = {s: sum(r.state == s for r in faulted) for s in ("completed", "cancelled")}
    report: dict[str, Any] = {
        "seed": args.seed,
        "dtype": args.dtype,
        "requests": args.requests,
        "kills_planned": len(fault_plan["faults"]),
        **states,
        "lost": sum(r.state == "lost" for r in faulted),
        "hung": sum(r.state == "hung" for r in faulted),
        "failed": sum(r.state == "failed" for r in faulted),
        "failures": sorted({r.error for r in faulted if r.state == "failed"})[:5],
        "resumed": sum(any(r.resumed_from) for r in faulted if r.state == "completed"),
        **info,
    }
    if bf16:
        report["replay_differs"] = len(replay(reqs, faulted, args.dtype))
    else:
        for i, (f, ref) in enumerate(zip(faulted, reference, strict=True)):
            if f.state == "completed" and ref.state == "completed" and f.ids != ref.ids:
                first = first_difference(f.ids, ref.ids)
                print(
                    "diverged: request",
                    i,
                    reqs[i].options,
                    "resumed",
                    f.resumed_from,
                    "first diff at",
                    first,
                    "len",
                    len(f.ids),
                    len(ref.ids),
                    file=sys.stderr,
                )
        report["diverged"] = sum(
            f.state == "completed" and ref.state == "completed" and f.ids != ref.ids
            for f, ref in zip(faulted, reference, strict=True)
        )
    report["seconds"] = round(time.monotonic() - start, 1)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>16}: {value}")
    bad = report["lost"] or report["hung"] or report["failed"] or report["escalated"]
    sys.exit(1 if bad or report.get("diverged") else 0)


if __name__ == "__main__":
    main()

"""Recovery at the frame boundaries review found broken: real processes, real
rings, faults from seeded fault plans (the cases of ../shared/repro/, as tests).

Each test says which defect it guards against; every one of them failed
(a hang, a crash loop, an escalation or a wrong output) before its fix.
"""

from __future__ import annotations

import os
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from crashy_scheduler import SlowToDieScheduler
from enginelib import NULL, collect, plan

import rt
import rt.frontend.wiring as wiring
from rt.actors import ActorState
from rt.errors import RequestFailedError
from rt.frontend.health import unhealthy
from rt.gpu import EngineConfig, EngineCore, SamplingParams
from rt.testing import wait_restarted


def actor(engine: rt.Engine, name: str) -> rt.actors.ActorStatus:
    return next(a for a in engine.actors() if a.name == name)


# ---- the detokenizer: commit means done -----------------------------------------------

_UNFAULTED: dict[Path, tuple[str, list[int]]] = {}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "hit"),
    [("receive", k) for k in range(1, 13)] + [("send", k) for k in range(1, 7)],
)
async def test_a_detokenizer_killed_at_any_frame_of_a_request_loses_nothing(
    tiny_model, tmp_path: Path, point: str, hit: int
) -> None:
    """The tokenizer's ids reach the frontend late, so the first tokens reach the
    detokenizer before their stream is open: they wait there. Killing it at each
    frame boundary of the request's life (before handling a frame, or after
    handling it and before sending on) must lose nothing: parked tokens keep their
    frame uncommitted for the successor. It used to crash-loop and escalate."""
    options: dict[str, Any] = dict(max_new_tokens=16, ignore_eos=True, temperature=0.0)
    if tiny_model not in _UNFAULTED:  # one fault-free run serves every case (in this worker)
        async with rt.open_engine(str(tiny_model), **NULL) as engine:
            _UNFAULTED[tiny_model] = await collect(engine, "In the beginning", **options)
    want = _UNFAULTED[tiny_model]
    rules = [
        {"actor": "tokenizer0", "point": "send", "action": "delay", "delay_ms": 300, "after": 1},
        {"actor": "detokenizer", "point": point, "action": "sigkill", "after": hit - 1},
    ]
    for rule in rules:
        rule["incarnation"] = 1
    async with rt.open_engine(
        str(tiny_model), fault_plan=plan(tmp_path, *rules), max_restarts=2, **NULL
    ) as engine:
        with trio.fail_after(60):
            got = await collect(engine, "In the beginning", **options)
        assert got == want
        assert actor(engine, "detokenizer").restart_count <= 1


@pytest.mark.slow
async def test_a_detokenizer_killed_again_and_again_under_load_loses_nothing(
    tiny_model, tmp_path: Path
) -> None:
    """Its successor's first frame follows everything its predecessor sent, so the
    frontend takes those frames, then reopens every stream: one ordered path."""
    reqs = [(f"prompt {i}", dict(max_new_tokens=80, ignore_eos=True, seed=i)) for i in range(24)]
    want: list[Any] = [None] * len(reqs)
    async with rt.open_engine(str(tiny_model), max_total_tokens=8192) as engine:

        async def ref(i: int) -> None:  # batched: float32 is batch-invariant
            want[i] = await collect(engine, reqs[i][0], **reqs[i][1])

        async with trio.open_nursery() as nursery:
            for i in range(len(reqs)):
                nursery.start_soon(ref, i)
    # each step of the scheduler slowed, so the load outlasts three restarts
    slow = plan(tmp_path, dict(actor="scheduler", point="step", action="delay", delay_ms=40,
                               times=10**6))  # fmt: skip
    async with rt.open_engine(
        str(tiny_model), max_total_tokens=8192, max_restarts=10, fault_plan=slow
    ) as engine:
        got: list[Any] = [None] * len(reqs)
        tokens, killed = 0, set()

        async def one(i: int) -> None:
            nonlocal tokens
            text, ids = "", []
            async for chunk in engine.stream(reqs[i][0], **reqs[i][1]):
                text, ids = text + chunk.text, ids + list(chunk.output_ids)
                tokens += len(chunk.output_ids)
            got[i] = (text, ids)

        async def killer() -> None:
            # three kills, each of a running successor that has delivered tokens since
            for _ in range(3):
                since = tokens
                while not (tokens >= since + 48 and actor(engine, "detokenizer").pid not in
                           killed | {None}):  # fmt: skip
                    await trio.sleep(0.005)
                pid = actor(engine, "detokenizer").pid or 0
                killed.add(pid)
                os.kill(pid, signal.SIGKILL)

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(killer)
                async with trio.open_nursery() as load:
                    for i in range(len(reqs)):
                        load.start_soon(one, i)
                assert len(killed) == 3, f"the load ended after {len(killed)} kill(s)"
                nursery.cancel_scope.cancel()
        assert got == want
        await wait_restarted(engine, "detokenizer", restarts=3, timeout=60)


# ---- a lost frame ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("victim", "point"),
    [("tokenizer0", "receive"), ("tokenizer0", "send"), ("scheduler", "receive")],
)
async def test_a_request_whose_frame_was_lost_is_sent_again(
    tmp_path: Path, victim: str, point: str
) -> None:
    """A fault plan drops the first frame the actor receives (or sends): the
    request, or its ids, never arrive. Nothing times a request out, so it hung
    for good (rt-chaos --kinds drop); now the frontend sends it again after
    ``stall_timeout`` without news, and it ends as an unfaulted run of it does."""
    rule = {"actor": victim, "point": point, "action": "drop", "incarnation": 1}
    options: dict[str, Any] = dict(max_new_tokens=8, ignore_eos=True, temperature=0.0)
    async with rt.open_engine(fault_plan=plan(tmp_path, rule), stall_timeout=1.0, **NULL) as engine:
        with trio.fail_after(30):
            start = trio.current_time()
            lost = await collect(engine, "In the beginning", **options)
            waited = trio.current_time() - start
            again = await collect(engine, "In the beginning", **options)
        assert lost == again and len(lost[1]) == 8
        assert waited >= 1.0  # it was sent again, not served the first time
        assert all(a.restart_count == 0 for a in engine.actors())


async def test_a_request_whose_last_frame_was_lost_is_resumed_after_a_copy(
    tmp_path: Path,
) -> None:
    """A request's last frame lost past the scheduler: its copy was generated again,
    and the detokenizer, which had passed those tokens, dropped them; every copy
    after it too: it hung for good (rt-chaos --kinds drop). Now a second copy is a new
    attempt, its streams reopened. One-token requests, one after another: their frames
    are each one's first and last, and of two sends in a row the detokenizer makes,
    one at least is such a frame (an idle report never follows another)."""
    rules = [
        {"actor": "detokenizer", "point": "send", "action": "drop", "after": after, "times": 1}
        for after in (5, 6)
    ]
    options: dict[str, Any] = dict(max_new_tokens=1, ignore_eos=True, temperature=0.0)
    prompts = [f"In the beginning {i}" for i in range(8)]
    faulted = plan(tmp_path, *rules)
    async with rt.open_engine(fault_plan=faulted, stall_timeout=0.5, **NULL) as engine:
        with trio.fail_after(60):
            got = [await collect(engine, prompt, **options) for prompt in prompts]
            want = [await collect(engine, prompt, **options) for prompt in prompts]
        assert got == want and all(len(ids) == 1 for _, ids in got)
        assert all(a.restart_count == 0 for a in engine.actors())


async def generate_all(engine: rt.Engine, n: int, options: dict[str, Any]) -> float:
    """``n`` requests at once, to their ends; how long they took."""
    with trio.fail_after(120):
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(partial(engine.generate, f"prompt {i}", **options))
        return trio.current_time() - start


async def test_a_request_queued_behind_a_busy_tokenizer_is_not_sent_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tokenizer working through a backlog answers steadily; a request behind it
    waits longer than ``stall_timeout`` for its ids, but it is queued, not lost.
    Sending it again only lengthened the queue (2,737 copies in one second for a
    batch of 5,000 prompts)."""
    rule = {"actor": "tokenizer0", "point": "tokenize", "action": "delay", "delay_ms": 150}
    rule["times"] = 0  # every batch
    options: dict[str, Any] = dict(max_new_tokens=2, ignore_eos=True, temperature=0.0)
    async with rt.open_engine(
        fault_plan=plan(tmp_path, rule), stall_timeout=0.5, tokenizer_batch_size=1, **NULL
    ) as engine:
        # (~2.4 s of tokenizing: the last ones wait ~5 timeouts)
        waited = await generate_all(engine, 16, options)
    assert waited > 4 * 0.5  # the backlog did outlast the timeout
    again = [r.getMessage() for r in caplog.records if "sending them again" in r.getMessage()]
    assert again == []


async def test_requests_queued_in_a_scheduler_at_work_are_not_sent_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Requests queued in the scheduler past its running limit have no news for
    longer than ``stall_timeout``, but they wait their turn, not lost: they were
    sent again (a batch of 65,536 prompts over HTTP had 25,000 sent again, more
    load on a front already behind)."""
    rule = {"actor": "scheduler", "point": "step", "action": "delay", "delay_ms": 40, "times": 0}
    options: dict[str, Any] = dict(max_new_tokens=10, ignore_eos=True, temperature=0.0)
    # (a timeout past the second a busy scheduler reports in: the frontend knows its queue)
    async with rt.open_engine(
        fault_plan=plan(tmp_path, rule), stall_timeout=1.5, max_running_requests=2, **NULL
    ) as engine:
        # (12 waves of ~0.45 s: the last wait ~5 s, ~3 timeouts)
        waited = await generate_all(engine, 24, options)
    assert waited > 2 * 1.5  # the queue did outlast the timeout
    lines = [r.getMessage() for r in caplog.records if "sending them again" in r.getMessage()]
    assert lines == []


async def test_a_request_lost_under_a_queue_that_never_empties_is_sent_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A queued request is not sent again for want of news, but only for
    QUEUE_PATIENCE stall timeouts: one whose frame was lost under steady overload
    (a queue that never empties) hung until the load stopped (found by a review)."""
    drop = {"actor": "scheduler", "point": "receive", "action": "drop", "incarnation": 1}
    drop["after"] = 40  # the first frame after a burst of 40 that makes the queue
    slow = {"actor": "scheduler", "point": "step", "action": "delay", "delay_ms": 40, "times": 0}
    options: dict[str, Any] = dict(max_new_tokens=10, ignore_eos=True, temperature=0.0)
    async with rt.open_engine(
        fault_plan=plan(tmp_path, drop, slow), stall_timeout=1.0, max_running_requests=2, **NULL
    ) as engine:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for i in range(40):
                    nursery.start_soon(partial(engine.generate, f"burst {i}", **options))
                    await trio.sleep(0)
                await trio.sleep(2.0)  # (the scheduler reports its queue once a second)
                start, lost_at, i = trio.current_time(), time.time(), 0
                while trio.current_time() - start < 7.0:  # more than 2 at a time can do
                    for _ in range(3):
                        nursery.start_soon(partial(engine.generate, f"load {i}", **options))
                        i += 1
                    await trio.sleep(0.5)
                load_ended = time.time()
    lines = [r for r in caplog.records if "sending them again" in r.getMessage()]
    again = [r.created for r in lines]
    assert any(lost_at < t < load_ended for t in again), (lost_at, load_ended, again)


async def test_an_overloads_stalled_requests_are_logged_in_one_line_a_pass(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Requests whose steps take longer than ``stall_timeout`` have no news and are
    sent again (idempotent). Each was a warning line of its own: 768 lines a pass
    for 1,024 requests over /ws."""
    rule = {"actor": "scheduler", "point": "step", "action": "delay", "delay_ms": 700, "times": 0}
    options: dict[str, Any] = dict(max_new_tokens=3, ignore_eos=True, temperature=0.0)
    async with rt.open_engine(fault_plan=plan(tmp_path, rule), stall_timeout=0.4, **NULL) as engine:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for i in range(8):  # all running at once (none queued), each step 0.7 s
                    nursery.start_soon(partial(engine.generate, f"prompt {i}", **options))
    lines = [r.getMessage() for r in caplog.records if "sending them again" in r.getMessage()]
    counts = [int(line.split(" ", 1)[0]) for line in lines]
    assert lines and max(counts) > 1, lines  # several requests stalled in one pass
    assert sum(counts) > len(lines)  # said in fewer lines than requests sent again


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "after"), [("receive", 4), ("receive", 12), ("send", 4), ("send", 12)]
)
async def test_a_frame_of_output_lost_resumes_its_requests_alone(
    tiny_model, tmp_path: Path, point: str, after: int
) -> None:
    """A frame lost on its way into the detokenizer (a step's tokens) or out of it
    (a step's deltas) leaves a gap in the output of every request in it: that failed
    them with an internal error. Now each is resumed alone from what the frontend
    holds, at its next attempt, and ends as an unfaulted run does (float32: byte for
    byte), with no restart and no stall timeout behind it. A lost stream's open (it
    hung its request) is sent again when the detokenizer asks about its tokens."""
    reqs = [
        (f"prompt {i}", dict(max_new_tokens=24, ignore_eos=True, seed=i, temperature=0.8 * (i % 2)))
        for i in range(8)
    ]
    want: list[Any] = [None] * len(reqs)
    got: list[Any] = [None] * len(reqs)

    async def run(engine: rt.Engine, out: list[Any]) -> None:
        async def one(i: int) -> None:
            if i % 2:  # streamed: the chunks must add up too
                out[i] = (*await collect(engine, reqs[i][0], **reqs[i][1]), None)
            else:
                o = await engine.generate(reqs[i][0], **reqs[i][1])
                out[i] = (o.text, list(o.output_ids), o.choices[0].resumed_from)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(len(reqs)):
                    nursery.start_soon(one, i)

    async with rt.open_engine(str(tiny_model), max_total_tokens=8192) as engine:
        await run(engine, want)
    # Three frames in a row: a single frame received may carry no output at all (an
    # inquiry about tokens whose stream was not open yet, healed by asking again).
    rule = dict(
        actor="detokenizer", point=point, action="drop", after=after, times=3, incarnation=1
    )
    async with rt.open_engine(
        str(tiny_model), max_total_tokens=8192, stall_timeout=0, fault_plan=plan(tmp_path, rule)
    ) as engine:
        await run(engine, got)
        assert all(a.restart_count == 0 for a in engine.actors())
    assert [g[:2] for g in got] == [w[:2] for w in want]
    if point == "send":  # (a frame received may be a stream's open instead: reopened)
        assert any(g[2] for g in got), "no request was resumed: the drop missed every output"


# ---- the scheduler: poison is isolated, the innocent finish --------------------------------

MARK = [5, 5, 5, 5, 5, 5, 5, 5]


@pytest.mark.slow
async def test_a_request_that_crashes_the_scheduler_fails_alone(tiny_model, tmp_path: Path) -> None:
    """Every request in flight at a crash is a suspect; after a repeat crash the
    suspects are halved until the culprit is alone in the scheduler, and the
    innocents finish with their normal output. Before, 4 of 5 innocents failed
    with the culprit. The culprit: a fault plan kills the scheduler's forward
    pass whenever a request whose prompt ids carry MARK is in its core, every
    time (as a kernel fault triggered by one request's shape would). While the
    suspects are told apart, with every actor running, /health says why new
    requests wait (it said 200)."""
    poison = {
        "actor": "scheduler",
        "point": "forward",
        "action": "exit",
        "times": 0,
        "match": f" {' '.join(map(str, MARK))} ",
    }
    greedy: dict[str, Any] = dict(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    prompts = [f"prompt number {i}" for i in range(5)]
    async with rt.open_engine(
        str(tiny_model), max_restarts=1, fault_plan=plan(tmp_path, poison), **NULL
    ) as engine:
        want = [await engine.generate(p, **greedy) for p in prompts]
        results: dict[str, Any] = {}

        async def one(name: str, prompt: Any) -> None:
            try:
                results[name] = await engine.generate(prompt, **greedy)
            except RequestFailedError as err:
                results[name] = err

        told: list[str | None] = []  # what /health said while suspects were told apart

        async def watch_health() -> None:
            while True:
                running = all(a.state is ActorState.RUNNING for a in engine.actors())
                if running and engine.table.isolating:
                    told.append(unhealthy(engine))
                await trio.sleep(0.001)

        with trio.fail_after(120):
            async with trio.open_nursery() as watching:
                watching.start_soon(watch_health)
                async with trio.open_nursery() as nursery:
                    for i, p in enumerate(prompts):
                        nursery.start_soon(one, f"innocent{i}", p)
                    nursery.start_soon(one, "poison", MARK)
                watching.cancel_scope.cancel()
        # new requests wait meanwhile: /health says so (it said 200)
        assert told and all(told) and any("crashed again" in (r or "") for r in told), set(told)
        assert isinstance(results.pop("poison"), RequestFailedError)
        assert [results[f"innocent{i}"].output_ids for i in range(5)] == [
            w.output_ids for w in want
        ]
        # a first crash, a repeat, then halving 6 suspects: 3 to 5 crashes, none
        # counted toward escalation (max_restarts=1)
        assert 3 <= actor(engine, "scheduler").restart_count <= 5
        after = await engine.generate("after", **greedy)
        assert len(after.output_ids) == 6


# ---- outputs one run produced -------------------------------------------------------------


@pytest.mark.slow
async def test_after_a_scheduler_restart_in_bfloat16_every_output_is_one_run(
    tiny_model, tmp_path: Path
) -> None:
    """In bfloat16 a re-prefill computes other logits than the decode it replaces, so
    the dead scheduler's tokens still on their way and its successor's continuation
    used to be spliced by offset. The detokenizer lags here (a delay per frame), so
    many of the old epoch's tokens are in flight when the successor resumes. Every
    output must be the prefix the frontend held plus what one run conditioned on
    it produced: the core, resumed at those points, gives exactly that."""
    prompts = [[(7 * i + j) % 300 + 3 for j in range(6 + i)] for i in range(6)]
    params = [
        SamplingParams(max_new_tokens=40, ignore_eos=True, temperature=0.8, seed=100 + i)
        for i in range(len(prompts))
    ]
    rules = [
        {"actor": "detokenizer", "point": "receive", "action": "delay", "delay_ms": 15},
        {"actor": "scheduler", "point": "step", "action": "sigkill", "after": 12},
    ]
    for rule in rules:
        rule.update(incarnation=1, times=0 if rule["action"] == "delay" else 1)
    opts: dict[str, Any] = dict(
        device="cpu", dtype="bfloat16", max_total_tokens=8192, chunked_prefill_size=-1
    )
    async with rt.open_engine(
        str(tiny_model), fault_plan=plan(tmp_path, *rules), max_restarts=1, **opts
    ) as engine:
        outs: list[Any] = [None] * len(prompts)

        async def one(i: int) -> None:
            p = params[i]
            outs[i] = await engine.generate(
                prompts[i], max_new_tokens=40, ignore_eos=True, temperature=0.8, seed=p.seed
            )

        with trio.fail_after(180):
            async with trio.open_nursery() as nursery:
                for i in range(len(prompts)):
                    nursery.start_soon(one, i)
        assert actor(engine, "scheduler").restart_count == 1
    resumed = [(i, o.choices[0]) for i, o in enumerate(outs) if o.choices[0].resumed_from]
    assert resumed, "the kill hit no request in flight"
    # Replayed as the successor ran them: resumed together, in one core (in bfloat16
    # the batch a request shares changes its logits, so each alone would not do).
    core = EngineCore(EngineConfig(model_path=tiny_model, **opts))
    for i, choice in resumed:
        (k,) = choice.resumed_from
        core.add_request(str(i), prompts[i], params[i], output_ids=[list(choice.output_ids)[:k]])
    again: dict[str, list[int]] = {str(i): [] for i, _ in resumed}
    while core.has_work:
        for o in core.step().outputs:
            again[o.rid] += o.token_ids
    for i, choice in resumed:
        (k,) = choice.resumed_from
        assert again[str(i)] == list(choice.output_ids)[k:], f"request {i}, resumed at {k}"


# ---- the scheduler: a forward pass that never ends is a hang --------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("hang", ["gil", "sleep"])
async def test_a_forward_pass_that_hangs_in_its_thread_is_a_hang(
    tiny_model, tmp_path: Path, hang: str
) -> None:
    """A step that may prefill runs in a worker thread while the scheduler's trio
    thread beats on; a forward pass stuck there (a Python busy loop, or a call that
    blocks with the GIL released) used to leave every request hanging and the
    scheduler healthy. Now the step outlives the watchdog: the scheduler is killed
    and restarted, the death charged to the requests in hand (not counted toward
    escalation: max_restarts=0), and every request ends as it would have."""
    greedy: dict[str, Any] = dict(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    prompts = [f"prompt number {i}" for i in range(4)]
    async with rt.open_engine(str(tiny_model), max_total_tokens=8192) as engine:
        want = [(await engine.generate(p, **greedy)).output_ids for p in prompts]
    # the first step prefills, so it runs in the worker thread
    rule = {
        "actor": "scheduler",
        "point": "forward",
        "action": "hang",
        "hang": hang,
        "incarnation": 1,
    }
    async with rt.open_engine(
        str(tiny_model),
        fault_plan=plan(tmp_path, rule),
        watchdog_timeout=3.0,  # a tiny model's step takes milliseconds
        max_restarts=0,
        max_total_tokens=8192,
    ) as engine:
        got: list[Any] = [None] * len(prompts)

        async def one(i: int) -> None:
            got[i] = (await engine.generate(prompts[i], **greedy)).output_ids

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for i in range(len(prompts)):
                    nursery.start_soon(one, i)
        assert got == want
        scheduler = actor(engine, "scheduler")
        assert scheduler.restart_count == 1 and scheduler.request_crashes == 1
        assert (scheduler.last_exit_reason or "").startswith("watchdog: no progress for")


# ---- the scheduler: a crash is known before the process has exited --------------------------


@pytest.mark.slow
async def test_a_scheduler_that_raises_is_unhealthy_before_it_has_exited(
    tiny_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An out-of-memory error in a step: the supervisor's status (what /health
    answers from) turns unhealthy while the dying scheduler still tears down,
    held here until the test opens the gate. It used to read healthy until the
    process had exited (0.1-3.8 s). Then the request completes as it would have."""
    greedy: dict[str, Any] = dict(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    async with rt.open_engine(str(tiny_model), max_total_tokens=8192) as engine:
        want = (await engine.generate("In the beginning", **greedy)).output_ids
    gate = tmp_path / "gate"
    monkeypatch.setenv("RT_TEST_EXIT_GATE", str(gate))
    monkeypatch.setattr(wiring, "SchedulerActor", SlowToDieScheduler)
    rule = {"actor": "scheduler", "point": "forward", "action": "oom", "after": 2, "incarnation": 1}
    async with rt.open_engine(
        str(tiny_model), fault_plan=plan(tmp_path, rule), max_total_tokens=8192
    ) as engine:
        got: list[Any] = []

        async def one() -> None:
            got.append((await engine.generate("In the beginning", **greedy)).output_ids)

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one)
                status = await engine.supervisor.wait_for(
                    lambda s: s.actor("scheduler").state is not ActorState.RUNNING
                )
                scheduler = status.actor("scheduler")
                assert scheduler.state is ActorState.EXITING and not status.healthy
                assert scheduler.incarnation == 1 and scheduler.last_exit_at is None
                gate.touch()
        assert got == [want]
        scheduler = actor(engine, "scheduler")
        assert scheduler.restart_count == 1 and scheduler.request_crashes == 1
        assert "MemoryError: fault plan rule 0: oom" in (scheduler.last_exit_reason or "")

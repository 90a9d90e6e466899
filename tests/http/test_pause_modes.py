"""``/pause_generation``'s modes: abort (SGLang's default) against what else holds
the engine (the Python API's requests on a served engine, a drain that begins
while the pause waits for a restarted scheduler), and retract."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import trio
from serverlib import SLOW_STEPS, Server, start_server, write_plan

import rt
from rt import errors
from rt.http import Settings, serve


async def test_a_pause_aborts_the_python_apis_requests_on_a_served_engine() -> None:
    """Only the HTTP front's were aborted: a Python caller's request sharing the
    engine was held through the pause and went on after it; /abort_request by its
    rid aborted none (it was a 404 then); and neither was counted in rt_aborted_requests."""
    async with rt.open_engine(torch_threads=1) as engine, trio.open_nursery() as nursery:
        url = await nursery.start(serve, engine, Settings(port=0))
        raised: dict[str, BaseException] = {}

        async def python_caller(rid: str, started: trio.Event) -> None:
            options: dict[str, Any] = dict(max_new_tokens=400, ignore_eos=True, rid=rid)
            try:
                async for _ in engine.stream("In the beginning", **options):
                    started.set()
            except errors.RequestAborted as err:
                raised[rid] = err

        async def started(rid: str) -> None:
            event = trio.Event()
            nursery.start_soon(python_caller, rid, event)
            with trio.fail_after(60):
                await event.wait()

        async def aborted(rid: str) -> None:
            with trio.fail_after(30):
                while rid not in raised:
                    await trio.sleep(0.02)

        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            await started("py-a")
            by_rid = await client.post("/abort_request", json={"rid": "py-a"})
            assert by_rid.json() == {"aborted": 1}, by_rid.text
            await aborted("py-a")
            await started("py-b")
            paused = await client.post("/pause_generation")
            assert paused.json() == {"status": "ok", "paused": True, "mode": "abort", "aborted": 1}
            await aborted("py-b")
            assert (await client.post("/continue_generation")).status_code == 200
            metrics = (await client.get("/metrics")).text
        for cause in ("abort_request", "pause_generation"):
            assert f'rt_aborted_requests_total{{cause="{cause}"}} 1.0' in metrics, cause
        nursery.cancel_scope.cancel()


async def test_a_drain_that_begins_while_a_pause_waits_is_not_undone_by_it(
    tmp_path: Path,
) -> None:
    """SIGINT while a pause waited for the restarted scheduler: the drain resumed
    generation to finish what was in flight, then the pause came back and aborted it
    all (200, "aborted": 3). Now the pause is a 503 and the requests finish."""
    plan = write_plan(tmp_path / "slow.json", SLOW_STEPS)
    server = start_server("--load-format=null", f"--fault-plan={plan}", "--drain-timeout=60")
    answers: dict[str, Any] = {}
    try:
        limits = httpx.Limits(max_connections=20, max_keepalive_connections=20)
        async with httpx.AsyncClient(base_url=server.url, timeout=90, limits=limits) as client:
            for _ in range(5):  # (connections open before the drain closes the listener)
                await client.get("/health")
            body = {"text": "x", "sampling_params": {"max_new_tokens": 150, "ignore_eos": True}}

            async def generate(i: int) -> None:
                answers[f"gen{i}"] = await client.post("/generate", json=body)

            async def pause() -> None:
                answers["pause"] = await client.post("/pause_generation")

            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(generate, i)
                with trio.fail_after(30):
                    while server.info()["requests_in_flight"] < 3:
                        await trio.sleep(0.02)
                os.kill(server.actor_pids()["scheduler"], signal.SIGKILL)
                await trio.sleep(0.05)
                nursery.start_soon(pause)
                await trio.sleep(0.3)  # (the successor is still starting)
                assert "pause" not in answers
                server.proc.send_signal(signal.SIGINT)
    finally:
        code = server.stop()
    assert code == 0
    assert answers["pause"].status_code == 503, answers["pause"].text
    for i in range(3):
        meta = answers[f"gen{i}"].json()["meta_info"]
        assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 150, meta


async def test_a_retracting_pause_gives_back_the_kv_and_the_requests_go_on(
    default_server: Server,
) -> None:
    """SGLang's mode retract was held as in_place: the requests kept their KV, so the
    flush an RL trainer makes before loading weights was refused. Now their KV is
    given back, the flush works, and after the continue they compute it again and
    end as they would have."""
    body: dict[str, Any] = {"text": "In the beginning", "stream": True}
    body["sampling_params"] = {"max_new_tokens": 60, "ignore_eos": True, "temperature": 0}
    url = default_server.url
    want = httpx.post(f"{url}/generate", json={**body, "stream": False}, timeout=60).json()
    events: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def read() -> None:
            async with client.stream("POST", "/generate", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        events.append(json.loads(line[6:]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            with trio.fail_after(30):
                while not events:
                    await trio.sleep(0.01)
            paused = await client.post("/pause_generation", json={"mode": "retract"})
            try:
                assert paused.json() == {"status": "ok", "paused": True, "mode": "retract"}
                scheduler = default_server.info()["scheduler"]
                # (its "requests" may count other tests' ended ones: their tombstones)
                assert scheduler["request_tokens"] == scheduler["running"] == 0, scheduler
                assert scheduler["waiting"] == 1, scheduler
                flushed = await client.post("/flush_cache")
                assert flushed.status_code == 200, flushed.text
                assert events[-1]["meta_info"]["finish_reason"] is None  # held, not ended
            finally:
                assert (await client.post("/continue_generation")).status_code == 200
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert events[-1]["output_ids"] == want["output_ids"]

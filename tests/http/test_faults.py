"""kill -9 an actor while 8 requests stream: each completes with the text it
has without the fault, and /health says 503 while the actor restarts, then
200. On the tiny checkpoint, with 20 ms scheduler steps."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from serverlib import SLOW_STEPS, Server, metrics, running_server, write_plan

PROMPTS = [f"The quick brown fox {i}" for i in range(8)]
TOKENS = 40


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    plan = write_plan(tmp_path_factory.mktemp("plan") / "slow.json", SLOW_STEPS)
    with running_server(f"--model-path={tiny_model}", f"--fault-plan={plan}") as s:
        yield s


async def stream_all(client: httpx.AsyncClient, first: trio.Semaphore | None = None) -> list[str]:
    texts = [""] * len(PROMPTS)

    async def one(i: int) -> None:
        body = {
            "text": PROMPTS[i],
            "stream": True,
            "sampling_params": {"max_new_tokens": TOKENS, "ignore_eos": True, "seed": i},
        }
        async with client.stream("POST", "/generate", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    event = json.loads(line[6:])
                    assert "error" not in event, event
                    if first is not None and not texts[i]:
                        first.release()
                    texts[i] = event["text"]
                    last = event
        assert last["meta_info"]["finish_reason"] == {"type": "length", "length": TOKENS}

    async with trio.open_nursery() as nursery:
        for i in range(len(PROMPTS)):
            nursery.start_soon(one, i)
    return texts


@pytest.mark.parametrize("actor", ["scheduler", "detokenizer"])
async def test_kill_an_actor_during_streams(server: Server, actor: str) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        baseline = await stream_all(client)
        restarts = server.info()["actors"]
        before = {a["name"]: a["restart_count"] for a in restarts}
        health: list[int] = []
        first = trio.Semaphore(0)
        killed = trio.Event()

        async def watch_health() -> None:
            await killed.wait()
            while True:
                health.append((await client.get("/health")).status_code)
                await trio.sleep(0.05)

        async def kill() -> None:
            for _ in PROMPTS:
                await first.acquire()  # every request is streaming
            os.kill(server.actor_pids()[actor], signal.SIGKILL)
            killed.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_health)
            nursery.start_soon(kill)
            texts = await stream_all(client, first)
            with trio.fail_after(60):
                while (await client.get("/health")).status_code != 200:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        assert texts == baseline
        assert health[0] == 503, health  # (was 200 until the exit was seen)
        after = {a["name"]: a["restart_count"] for a in server.info()["actors"]}
        assert after[actor] == before[actor] + 1
        metrics = (await client.get("/metrics")).text
        assert f'rt_actor_restarts_total{{actor="{actor}"}} {after[actor]}.0' in metrics


async def test_retractions_are_counted_since_start_through_a_scheduler_restart() -> None:
    """rt_retractions_total was the running scheduler's own count: a restart took
    it back to 0, and a Prometheus counter that falls reads as a reset."""
    with running_server("--load-format=null", "--max-total-tokens=600") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            body = {"text": "In the beginning", "sampling_params": {"max_new_tokens": 250}}
            body["sampling_params"]["ignore_eos"] = True
            async with trio.open_nursery() as nursery:
                for _ in range(6):  # 6 × 250 tokens in a pool of 600: some must wait their turn
                    nursery.start_soon(partial(client.post, "/generate", json=body))
            with trio.fail_after(30):  # (the report of the scheduler gone idle after them)
                while (sched := server.info()["scheduler"])["steps"] < 250 or sched["running"]:
                    await trio.sleep(0.05)
            before = metrics(server)["rt_retractions_total{}"]
            assert before == sched["retractions"] > 0
            pid = server.actor_pids()["scheduler"]
            os.kill(pid, signal.SIGKILL)
            with trio.fail_after(60):
                while server.actor_pids()["scheduler"] == pid or not server.info()["healthy"]:
                    await trio.sleep(0.05)
                while (server.info()["scheduler"] or {}).get("retractions", 1):  # the new one's
                    await trio.sleep(0.05)
            assert metrics(server)["rt_retractions_total{}"] == before
            assert (await client.post("/generate", json=body)).status_code == 200


async def test_a_stream_that_fails_after_it_began_counts_what_it_sent(tmp_path: Path) -> None:
    """A streamed batch whose second prompt crashes the scheduler, until it fails
    alone as poison, after the first one's tokens went out: the 200 and those
    tokens are the client's, and are counted (an error after a stream began is
    no refusal of the request)."""
    poison = {"actor": "scheduler", "point": "forward", "action": "sigkill", "match": " 744 "}
    plan = write_plan(tmp_path / "poison.json", {"seed": 1, "faults": [{**poison, "times": 0}]})
    params = {"max_new_tokens": 4, "ignore_eos": True}
    body = {
        "text": ["In the beginning", "Behold the zebra of Egypt"],  # (744: "zebra"'s id)
        "stream": True,
        "sampling_params": [params, params],
    }
    with running_server(f"--fault-plan={plan}") as server:
        before = metrics(server)
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=120) as client,
            client.stream("POST", "/generate", json=body) as response,
        ):
            assert response.status_code == 200
            events = [
                json.loads(line[6:])
                async for line in response.aiter_lines()
                if line.startswith("data: {")
            ]
        after = metrics(server)
    errors = [e for e in events if "error" in e]
    ends = [e["meta_info"]["finish_reason"] for e in events if "error" not in e]
    assert len(errors) == 1 and {"type": "length", "length": 4} in ends, events
    moved = {name: after[name] - before.get(name, 0.0) for name in after}
    assert moved["rt_generation_tokens_total{}"] == 4, moved  # (counted nothing)
    assert moved["rt_finished_requests_total{reason=length}"] == 1
    assert moved["rt_e2e_request_latency_seconds_count{}"] == 1

"""kill -9 an actor while 8 requests stream: each completes with the text it
has without the fault, and /health says 503 while the actor restarts, then
200. On the tiny checkpoint, with 20 ms scheduler steps."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio
from serverlib import SLOW_STEPS, Server, running_server, write_plan

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

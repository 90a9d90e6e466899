"""Many prompts in one request, or many big bodies at once, against rt-serve: the
server goes on answering (rt/http/generation.py's intake, Front.parse's turns)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio
from serverlib import Server

PROMPTS = 6000


async def test_a_batch_of_many_prompts_leaves_the_server_answering(default_server: Server) -> None:
    """A batch started a task a prompt at once, and the front's loop ran them all
    before anything else: one 320 KB body of 65,536 prompts left /health unanswered
    for 20 s and other clients' kept-alive connections dropped. Now at most
    ``INTAKE`` prompts of a request are on their way in at a time: /health answers
    all along (the longest wait between its answers a small part of the batch's
    time, not most of it), and the batch is answered whole."""
    body = {"prompt": ["a"] * PROMPTS, "max_tokens": 1}
    answered: list[float] = []
    done = trio.Event()
    out: dict[str, httpx.Response] = {}

    async def probe(client: httpx.AsyncClient) -> None:
        while not done.is_set():
            response = await client.get("/health")
            assert response.status_code == 200
            answered.append(time.monotonic())
            await trio.sleep(0.02)

    async with (
        httpx.AsyncClient(base_url=default_server.url, timeout=300) as batch,
        httpx.AsyncClient(base_url=default_server.url, timeout=300) as prober,
    ):
        await prober.get("/health")  # (its connection open before the batch)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe, prober)
            start = time.monotonic()
            out["r"] = await batch.post("/v1/completions", json=body)
            took = time.monotonic() - start
            done.set()
    response = out["r"]
    assert response.status_code == 200, response.text
    assert sorted(c["index"] for c in response.json()["choices"]) == list(range(PROMPTS))
    gaps = [b - a for a, b in zip([start, *answered], answered, strict=False)]
    assert max(gaps) < took / 3, (max(gaps), took)  # (before: 0.65 of it)


async def test_big_bodies_at_once_leave_the_server_answering(default_server: Server) -> None:
    """Parsing a body holds the front's loop (~0.2 s for 15 MiB of token ids), and
    /health takes several rounds of it: 20 such bodies at once left it unanswered
    3.6 s. Big bodies now parse one at a time, each after a pause as long as the
    last parse took: /health answers between them."""
    body = json.dumps({"prompt": [7] * (7 << 20), "max_tokens": 1}, separators=(",", ":"))
    answered: list[float] = []
    done = trio.Event()

    async def probe(client: httpx.AsyncClient) -> None:
        while not done.is_set():
            assert (await client.get("/health")).status_code == 200
            answered.append(time.monotonic())
            await trio.sleep(0.02)

    async def big(client: httpx.AsyncClient) -> None:
        response = await client.post("/v1/completions", content=body)
        assert response.status_code == 400 and "context length" in response.text

    async with (
        httpx.AsyncClient(base_url=default_server.url, timeout=300) as bigs,
        httpx.AsyncClient(base_url=default_server.url, timeout=300) as prober,
    ):
        await prober.get("/health")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe, prober)
            start = time.monotonic()
            async with trio.open_nursery() as senders:
                for _ in range(10):
                    senders.start_soon(big, bigs)
            took = time.monotonic() - start
            done.set()
    gaps = [b - a for a, b in zip([start, *answered], answered, strict=False)]
    assert max(gaps) < took / 3, (max(gaps), took)  # (before: 0.54 of it)


async def test_every_prompt_of_a_batch_is_abortable_before_its_turn(
    default_server: Server,
) -> None:
    """A prompt waiting for its turn (past the first INTAKE) was in no table that
    /abort_request looks in: by its own rid, a 404, and it ran to its end. Then
    (found by reviews) any single request took such a rid (its batch failed when
    the prompt started), an abort of it went to that request, and a request that
    ended released rids another batch had reserved since."""
    count = 6000  # (> INTAKE: the last wait their turns a second or so)
    rids = [f"turn-{i}" for i in range(count - 1)] + ["first-0"]  # (its last: first's)
    one = {"max_new_tokens": 1, "ignore_eos": True}
    body = {"text": ["In the"] * count, "rid": rids, "sampling_params": one}
    first = {"text": ["a", "b"], "rid": ["first-0", "first-1"]}
    first["sampling_params"] = [one, {"max_new_tokens": 300, "ignore_eos": True}]
    out: dict[str, httpx.Response] = {}

    async def post(client: httpx.AsyncClient, name: str, body: dict[str, Any]) -> None:
        out[name] = await client.post("/generate", json=body)

    async def in_flight(client: httpx.AsyncClient) -> int:
        return int((await client.get("/server_info")).json()["requests_in_flight"])

    async with (
        httpx.AsyncClient(base_url=default_server.url, timeout=300) as client,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(post, client, "first", first)
        with trio.fail_after(60):  # (first-0 done, first-1 going on)
            while await in_flight(client) != 1:
                await trio.sleep(0.01)
        nursery.start_soon(post, client, "batch", body)
        with trio.fail_after(60):
            while await in_flight(client) < 2:
                await trio.sleep(0.01)
        aborted = await client.post("/abort_request", json={"rid": "first-1"})
        assert aborted.json() == {"aborted": 1}, aborted.text
        with trio.fail_after(60):  # (the first request ends: first-0 stays the batch's)
            while "first" not in out:
                await trio.sleep(0.01)
        taken = await client.post("/v1/completions", json={"prompt": "x", "rid": rids[-2]})
        assert taken.status_code == 400 and "already in flight" in taken.text, taken.text
        aborted = await client.post("/abort_request", json={"rid": "first-0"})
        assert aborted.status_code == 200 and aborted.json() == {"aborted": 1}, aborted.text
    results = out["batch"].json()
    assert results[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in results[:-1])


def test_bench_stall_prints_what_health_waited(default_server: Server) -> None:
    """tools/bench_stall.py, the measure of the two fixes above (docs/benchmarks.md)."""
    tool = Path(__file__).resolve().parents[2] / "tools" / "bench_stall.py"
    out = subprocess.run(
        [sys.executable, str(tool), "--url", default_server.url, "--batch", "300"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert re.search(r"load: 1 request\(s\) to /v1/completions, [\d.]+ s, statuses \[200\]", out)
    assert re.search(r"/health: \d+ probes, longest wait [\d.]+ s, \d+ over 1 s, failed none", out)

"""rt/http/generation.py: many prompts of one request against rt-serve."""

from __future__ import annotations

import time

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

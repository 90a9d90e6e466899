"""``/ws``: a client that reads and sends a burst of frames, more than its
generations in flight and the server's outgoing queue can hold, gets every
refusal and every ``done``, and keeps its connection. One rt-serve with the
null model and a small ``--ws-max-in-flight``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from serverlib import Server, running_server
from trio_websocket import WebSocketConnection, open_websocket_url

from rt.http.ws import OUT_QUEUE

LIMIT = 4  # --ws-max-in-flight
TOKENS = 200  # long enough that the accepted ones hold their places through the burst
EXTRA = 100  # frames past LIMIT + OUT_QUEUE


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server("--load-format=null", f"--ws-max-in-flight={LIMIT}") as s:
        yield s


def generate(cid: Any, tokens: int) -> str:
    params = {"max_new_tokens": tokens, "ignore_eos": True}
    return json.dumps({"id": cid, "type": "generate", "text": "In the", "sampling_params": params})


async def ends_of(ws: WebSocketConnection, frames: list[str]) -> dict[Any, dict[str, Any]]:
    """Send ``frames`` at once, a reader running from before the first: each id's
    last frame (``done`` or ``error``), once every id has one."""
    ends: dict[Any, dict[str, Any]] = {}
    want = len(frames)

    async def read() -> None:
        while len(ends) < want:
            frame = json.loads(await ws.get_message())
            if frame["type"] != "delta":
                assert frame["id"] not in ends, (frame, ends[frame["id"]])
                ends[frame["id"]] = frame

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            for frame in frames:
                await ws.send_message(frame)
    return ends


async def test_a_reading_client_that_bursts_gets_every_refusal_and_every_done(
    server: Server,
) -> None:
    """The refusals (429: past the limit) met the queue full and the connection was
    closed with 1008 as if the client did not read, its generations lost."""
    count = LIMIT + OUT_QUEUE + EXTRA
    async with open_websocket_url(f"ws://127.0.0.1:{server.port}/ws") as ws:
        ends = await ends_of(ws, [generate(i, TOKENS) for i in range(count)])
        assert sorted(ends) == list(range(count))
        done = [f for f in ends.values() if f["type"] == "done"]
        refused = [f for f in ends.values() if f["type"] == "error"]
        assert {f["status"] for f in refused} == {429}, refused[:3]
        assert len(done) >= LIMIT and len(refused) > OUT_QUEUE, (len(done), len(refused))
        assert all(f["meta_info"]["completion_tokens"] == TOKENS for f in done)
        # refusals alone (nothing in flight): 400s for a type unknown
        bad = [json.dumps({"id": f"nope{i}", "type": "sing"}) for i in range(count)]
        ends = await ends_of(ws, bad)
        assert len(ends) == count and {f["status"] for f in ends.values()} == {400}
        ends = await ends_of(ws, [generate("after", 2)])  # the connection is still open
        assert ends["after"]["type"] == "done", ends

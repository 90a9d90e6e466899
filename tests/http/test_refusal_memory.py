"""What a refused request leaves in the server's memory once it is answered:
nothing that waits for Python's full collection (rare in a process that makes
few objects, and never while it is idle)."""

from __future__ import annotations

import gc
from typing import Any

import httpx
import trio

import rt
from rt.http import Settings, serve
from rt.http.asgi import HTTPError


async def test_a_refused_request_leaves_no_cycle_holding_its_body() -> None:
    """A prompt the engine refuses (over the context): its error left ``run()`` with
    its traceback holding run's frame, whose list of failures held the error, a
    cycle that kept the body, the request and the prompt until a full collection
    (refused 8 MB prompts kept the server at ~0.7 GB, not 0.25, while idle)."""
    body = {"text": "word " * 20_000, "sampling_params": {"max_new_tokens": 2}}
    engine_options: dict[str, Any] = dict(load_format="null", torch_threads=1)
    async with rt.open_engine(**engine_options) as engine, trio.open_nursery() as nursery:
        url = await nursery.start(serve, engine, Settings(port=0))
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            await client.post("/generate", json=body)  # (what the first request makes once)
            gc.collect()
            gc.disable()
            try:
                response = await client.post("/generate", json=body)
                gc.set_debug(gc.DEBUG_SAVEALL)
                gc.collect()
                held = [o for o in gc.garbage if isinstance(o, HTTPError)]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()
        nursery.cancel_scope.cancel()
    assert response.status_code == 400 and "context" in response.text, response.text
    assert not held

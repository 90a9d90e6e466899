"""A request that hangs the one tokenizer worker costs ``max_crashes_per_request``
watchdog kills, no more: the stall watch sends no copies to a worker at work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

import rt

NULL: dict[str, object] = dict(device="cpu", load_format="null", torch_threads=1)


@pytest.mark.slow
async def test_a_request_that_hangs_the_tokenizer_costs_max_crashes_kills_no_more(
    tmp_path: Path,
) -> None:
    """While a request hung the tokenizer, stall detection sent it again (the worker
    was silent), and each copy, still queued after the request had failed as poison,
    cost one more watchdog kill (one request kept a one-worker server from serving
    for minutes, with the defaults). A worker at work is not sent copies: it is
    killed max_crashes_per_request times, and serves on."""
    hang = {"actor": "tokenizer0", "point": "tokenize", "action": "hang", "hang": "gil"}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"seed": 1, "faults": [{**hang, "match": "POISON"}]}))
    options = dict(NULL, fault_plan=str(path), watchdog_timeout=2.0, stall_timeout=4.0)
    async with rt.open_engine(**options) as engine:
        with trio.fail_after(60), pytest.raises(rt.errors.RequestFailedError, match="3 tokenizer"):
            await engine.generate("POISON", max_new_tokens=2)
        await trio.sleep(10.0)  # room for copies to be sent and hang it again
        with trio.fail_after(30):
            out = await engine.generate("fine", max_new_tokens=2)
        assert len(out.output_ids) > 0
        assert engine.supervisor.status().actor("tokenizer0").restart_count == 3

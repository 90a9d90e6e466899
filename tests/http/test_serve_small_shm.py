"""rt-serve in a container's small /dev/shm. A prompt more than half a ring
goes through a side segment of its own; before, the front wrote it into an
unreserved tmpfs page and died of SIGBUS when the tmpfs was full: concurrent
large prompts took the whole server down. Now a side segment waits for room as
a full ring does, and one bigger than all of /dev/shm is a 413 alone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import small_shm
import trio
from serverlib import running_server, write_plan

pytestmark = pytest.mark.skipif(not small_shm.available(), reason="unshare -m is not permitted")

SLOW_TOKENIZER = {  # 100 ms a message: the front's side segments pile up in /dev/shm
    "seed": 1,
    "faults": [
        {"actor": "tokenizer0", "point": "receive", "action": "delay", "delay_ms": 100, "times": 0}
    ],
}


def completion(words: int) -> dict[str, object]:
    return {"model": "default", "prompt": "word " * words, "max_tokens": 2}


async def test_large_prompts_wait_for_room_and_one_too_big_is_413(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "slow.json", SLOW_TOKENIZER)
    # 64 KiB rings (7 of them) in 2 MiB: room for two 0.7 MB prompts at a time.
    args = ("--ring-capacity=65536", f"--fault-plan={plan}")
    with running_server(*args, shm_size="2m") as server:
        statuses: list[tuple[int, str]] = []
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:

            async def large() -> None:
                r = await client.post("/v1/completions", json=completion(140_000))
                statuses.append((r.status_code, r.json()["error"]["code"]))

            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(large)
            # Each reached the tokenizer, which refused it for the context alone.
            assert statuses == [(400, "context_length_exceeded")] * 8

            r = await client.post("/v1/completions", json=completion(540_000))  # 2.7 MB
            assert r.status_code == 413, r.text
            message = r.json()["error"]["message"]
            assert re.search(
                r"/dev/shm has no room for a segment of 2\.\d MiB \(more than all", message
            )
            assert "--shm-size" in message

            r = await client.post("/v1/completions", json=completion(8))
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 2
        actors = server.info()["actors"]
        assert [(a["name"], a["restart_count"]) for a in actors] == [
            ("detokenizer", 0),
            ("scheduler", 0),
            ("tokenizer0", 0),
        ]
        assert any("the frame waits for room" in line for line in server.log)


def test_a_dev_shm_too_small_for_the_rings_stops_the_start_with_the_remedy() -> None:
    # Seven 4 MiB rings do not fit 16 MiB: said at start, not a SIGBUS under load.
    command = [sys.executable, "-m", "rt.serve", "--port", "0", "--torch-threads=1"]
    out = subprocess.run(
        small_shm.argv("16m", command), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1, out.stderr
    assert "could not start: /dev/shm has no room for a segment of 4.0 MiB" in out.stderr
    assert "--shm-size" in out.stderr

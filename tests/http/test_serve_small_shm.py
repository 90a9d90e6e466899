"""rt-serve in a container's small /dev/shm. A prompt more than half a ring
goes through a side segment of its own; before, the front wrote it into an
unreserved tmpfs page and died of SIGBUS when the tmpfs was full: concurrent
large prompts took the whole server down. Now a side segment waits for room as
a full ring does, and one bigger than all of /dev/shm is a 413 alone."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import small_shm
import trio
from serverlib import running_server, write_plan

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "rt" / "assets" / "default_model"
pytestmark = pytest.mark.skipif(not small_shm.available(), reason="unshare -m is not permitted")

SLOW_TOKENIZER = {  # 100 ms a message: the front's side segments pile up in /dev/shm
    "seed": 1,
    "faults": [
        {"actor": "tokenizer0", "point": "receive", "action": "delay", "delay_ms": 100, "times": 0}
    ],
}


def completion(words: int) -> dict[str, object]:
    return {"model": "default", "prompt": "word " * words, "max_tokens": 2, "ignore_eos": True}


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

            # 2.7 MB: more than all of /dev/shm; 1.8 MB: more than the rings leave of it
            # (it waited for good, holding the ring's lock: every later request behind it)
            for words, mib in ((540_000, r"2\.\d"), (360_000, r"1\.\d")):
                r = await client.post("/v1/completions", json=completion(words))
                assert r.status_code == 413, r.text
                message = r.json()["error"]["message"]
                expected = rf"no room for a segment of {mib} MiB \(more than its 2\.0 MiB hold"
                assert re.search(expected, message), message
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


async def test_a_tokenizer_whose_answer_finds_no_room_refuses_that_request_alone(
    tmp_path: Path,
) -> None:
    # 170k ids in 64 KiB rings and 2 MiB: the front's frame (0.5 MiB) and the tokenizer's
    # answer (1.3 MiB) both need side segments, and the tokenizer keeps its input's until
    # it has sent its answer (commit after handling): the answer waited for good, the
    # server wedged with /health 200. Now the wait ends (10 s) and the request is refused.
    model = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL, model, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 300_000}))
    args = (f"--model-path={model}", "--load-format=null", "--ring-capacity=65536")
    with running_server(*args, "--max-total-tokens=290000", shm_size="2m") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            body = {"input_ids": [1000] * 170_000, "sampling_params": {"max_new_tokens": 1}}
            r = await client.post("/generate", json=body)
            assert r.status_code == 503, r.text
            assert "no room to pass it on now: /dev/shm has no room" in r.text
            r = await client.post(
                "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}}
            )
            assert r.status_code == 200, r.text
            assert (await client.get("/health")).status_code == 200

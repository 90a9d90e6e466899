"""/metrics counts what happened: a batch refused whole, a health probe and the
WebSocket's requests, on the default model (a generation its client cut short:
tests/http/test_limits.py's disconnects)."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import trio
from serverlib import Server, metrics
from trio_websocket import open_websocket_url

PROMPT_TOKENS = "rt_prompt_tokens_total{}"
GENERATED = "rt_generation_tokens_total{}"
CANCELLED = "rt_aborted_requests_total{cause=cancelled}"
TTFT = "rt_time_to_first_token_seconds_count{}"
E2E = "rt_e2e_request_latency_seconds_count{}"
QUEUED = "rt_queue_time_seconds_count{}"


def moved(before: dict[str, float], after: dict[str, float]) -> Callable[[str], float]:
    return lambda name: after.get(name, 0.0) - before.get(name, 0.0)


async def settled(server: Server) -> dict[str, float]:
    """/metrics once nothing is in flight and two scrapes agree: what a test before
    this one left unwinding (a client that left, counted as its task ends) is in."""
    with trio.fail_after(30):
        last: dict[str, float] = {}
        while True:
            if server.info()["requests_in_flight"] == 0:
                now = {k: v for k, v in metrics(server).items() if not _scraping(k)}
                if now == last:
                    return now
                last = now
            await trio.sleep(0.1)


def _scraping(sample: str) -> bool:
    """A sample the scrapes themselves move (their requests, their connections)."""
    return sample.startswith("rt_http_") or any(
        f"endpoint={path}," in sample for path in ("/metrics", "/server_info")
    )


async def test_a_batch_refused_whole_is_no_abort_and_counts_no_token(
    default_server: Server,
) -> None:
    """A batch whose second prompt is past the context is a 400; its first prompt,
    started and cancelled by that refusal, was counted as a client's abort."""
    before = await settled(default_server)
    body = {
        "text": ["In the beginning", "And God said " * 400],
        "sampling_params": {"max_new_tokens": 400, "ignore_eos": True},
    }
    async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
        answer = await client.post("/generate", json=body)
    assert answer.status_code == 400, answer.text
    assert "text[1]" in answer.json()["error"]["message"]
    after = metrics(default_server)
    delta = moved(before, after)
    assert delta(CANCELLED) == 0
    assert delta(PROMPT_TOKENS) == delta(GENERATED) == delta(E2E) == delta(TTFT) == 0
    assert delta("rt_requests_total{endpoint=/generate,status=400}") == 1
    # nor is a prompt that finished before the refusal came (it was, now and then)
    texts = ["In", "In the", "In the beginning", "And God said " * 3000]
    body = {"text": texts, "sampling_params": {"max_new_tokens": 1}}
    async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
        for _ in range(5):
            answer = await client.post("/generate", json=body)
            assert answer.status_code == 400 and "text[3]" in answer.text, answer.text
    delta = moved(after, metrics(default_server))
    assert delta(PROMPT_TOKENS) == delta(GENERATED) == delta(E2E) == delta(TTFT) == 0
    assert delta("rt_inter_token_latency_seconds_count{}") == 0


async def test_a_health_probe_is_no_users_traffic(default_server: Server) -> None:
    """/health_generate makes a token, and was counted as a request: a load
    balancer probing a quiet server filled its latency histograms."""
    before = await settled(default_server)
    async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
        for _ in range(3):
            assert (await client.get("/health_generate")).status_code == 200
    delta = moved(before, metrics(default_server))
    for name in (PROMPT_TOKENS, GENERATED, TTFT, E2E, QUEUED, "rt_finished_requests_total{"
                 "reason=length}"):  # fmt: skip
        assert delta(name) == 0, name
    assert delta("rt_requests_total{endpoint=/health_generate,status=200}") == 3


async def test_the_websockets_requests_are_counted(default_server: Server) -> None:
    """Each ``generate`` frame is a request of /ws's in rt_requests_total, by the
    status it was answered with (none was counted)."""
    before = await settled(default_server)
    url = default_server.url.replace("http://", "ws://") + "/ws"
    async with open_websocket_url(url) as ws:
        for cid in ("a", "b"):
            frame = {"id": cid, "type": "generate", "text": "In the beginning"}
            await ws.send_message(json.dumps({**frame, "sampling_params": {"max_new_tokens": 2}}))
        await ws.send_message(json.dumps({"id": "c", "type": "generate", "text": 3}))
        ends = []
        with trio.fail_after(60):
            while len(ends) < 3:
                answer = json.loads(await ws.get_message())
                if answer["type"] in ("done", "error"):
                    ends.append((answer["id"], answer.get("status", 200)))
    assert sorted(ends) == [("a", 200), ("b", 200), ("c", 400)], ends
    delta = moved(before, metrics(default_server))
    assert delta("rt_requests_total{endpoint=/ws,status=200}") == 2
    assert delta("rt_requests_total{endpoint=/ws,status=400}") == 1

"""Health, state, metrics and control endpoints, on the default model."""

from __future__ import annotations

import json

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families
from serverlib import Server


def metrics(server: Server) -> dict[str, float]:
    """Every sample, keyed ``name{label=value,...}``."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def test_health(default_server: Server) -> None:
    response = httpx.get(f"{default_server.url}/health", timeout=30)
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert httpx.get(f"{default_server.url}/health_generate", timeout=60).status_code == 200


def test_server_info(default_server: Server) -> None:
    info = default_server.info()
    assert info["version"]
    assert info["model"]["context_length"] == 512
    assert info["config"]["max_running_requests"] > 0
    assert {a["name"] for a in info["actors"]} == {"tokenizer0", "scheduler", "detokenizer"}
    for actor in info["actors"]:
        assert actor["state"] == "running"
        assert actor["pid"] > 0
        assert set(actor) >= {"name", "pid", "state", "restart_count", "last_exit_reason"}


def test_metrics_parse_and_move(default_server: Server) -> None:
    before = metrics(default_server)
    body = {"text": "And God said", "sampling_params": {"max_new_tokens": 8}}
    httpx.post(f"{default_server.url}/generate", json=body, timeout=60).raise_for_status()
    after = metrics(default_server)
    for name in (
        "rt_time_to_first_token_seconds_count{}",
        "rt_e2e_request_latency_seconds_count{}",
        "rt_generation_tokens_total{}",
        "rt_prompt_tokens_total{}",
        "rt_requests_total{endpoint=/generate,status=200}",
    ):
        assert after[name] > before.get(name, 0.0), name
    assert (
        after["rt_inter_token_latency_seconds_count{}"]
        >= before.get("rt_inter_token_latency_seconds_count{}", 0) + 7
    )
    for actor in ("scheduler", "detokenizer", "tokenizer0"):
        assert after[f"rt_actor_restarts_total{{actor={actor}}}"] == 0
        assert after[f"rt_actor_up{{actor={actor}}}"] == 1
    for name in ("rt_num_running_reqs{}", "rt_num_queue_reqs{}", "rt_cache_hit_rate{}"):
        assert name in after
    assert 0 <= after["rt_kv_cache_usage{}"] <= 1
    assert "rt_retractions_total{}" in after


async def test_abort_request_by_rid(default_server: Server) -> None:
    body = {
        "text": "In the beginning",
        "rid": "to-abort",
        "stream": True,
        "sampling_params": {"max_new_tokens": 400, "ignore_eos": True},
    }
    async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
        before = metrics(default_server).get("rt_aborted_requests_total{cause=abort_request}", 0)
        events = []
        async with client.stream("POST", "/generate", json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if len(events) == 2:
                    abort = await client.post("/abort_request", json={"rid": "to-abort"})
                    assert abort.status_code == 200
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < len(last["output_ids"]) < 400
        missing = await client.post("/abort_request", json={"rid": "to-abort"})
        assert missing.status_code == 404
        with trio.fail_after(10):
            while (
                metrics(default_server).get("rt_aborted_requests_total{cause=abort_request}", 0)
                <= before
            ):
                await trio.sleep(0.05)


def test_control_endpoints_say_what_is_missing(default_server: Server) -> None:
    for path in ("/flush_cache", "/pause_generation", "/continue_generation"):
        response = httpx.post(f"{default_server.url}{path}", timeout=30)
        assert response.status_code == 501, path
        assert "engine" in response.json()["error"]["message"]


def test_unknown_endpoint_and_method(default_server: Server) -> None:
    missing = httpx.get(f"{default_server.url}/nope", timeout=30)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"
    wrong = httpx.get(f"{default_server.url}/generate", timeout=30)
    assert wrong.status_code == 405
    assert wrong.headers["allow"] == "POST"


def test_openapi_document(default_server: Server) -> None:
    doc = httpx.get(f"{default_server.url}/openapi.json", timeout=30).json()
    assert doc["openapi"].startswith("3.")
    for path in ("/generate", "/v1/completions", "/v1/chat/completions", "/health", "/ws"):
        assert path in doc["paths"], path
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    ref = body["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert "messages" in schema["properties"]

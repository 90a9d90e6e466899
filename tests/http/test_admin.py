"""Health, state, metrics and control endpoints, on the default model."""

from __future__ import annotations

import json
import os
import signal
import time
from functools import partial
from typing import Any

import httpx
import trio
from serverlib import Server, metrics


def test_health(default_server: Server) -> None:
    response = httpx.get(f"{default_server.url}/health", timeout=30)
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert httpx.get(f"{default_server.url}/health_generate", timeout=60).status_code == 200
    # vLLM's (and SageMaker's) /ping, either method, and /version
    for method in ("GET", "POST"):
        ping = httpx.request(method, f"{default_server.url}/ping", timeout=30)
        assert ping.status_code == 200 and ping.json() == {"status": "ok"}
    version = httpx.get(f"{default_server.url}/version", timeout=30).json()["version"]
    assert version == default_server.info()["version"]


def test_head_answers_what_get_would_without_the_body(default_server: Server) -> None:
    """Load balancers' and proxies' health checks may send HEAD (RFC 9110: a server
    that takes GET takes HEAD); it was a 405."""
    for path in ("/health", "/metrics", "/server_info", "/v1/models", "/openapi.json"):
        head = httpx.head(default_server.url + path, timeout=30)
        get = httpx.get(default_server.url + path, timeout=30)
        assert head.status_code == get.status_code == 200, (path, head.status_code)
        assert head.content == b"" and int(head.headers["content-length"]) > 0, path
        assert head.headers["content-type"] == get.headers["content-type"], path
    refused = httpx.head(default_server.url + "/generate", timeout=30)
    assert refused.status_code == 405 and refused.headers["allow"] == "POST, PUT"  # (SGLang's)
    assert httpx.get(default_server.url + "/generate", timeout=30).json()["error"]["message"] == (
        "/generate takes POST or PUT, not GET"
    )
    assert httpx.post(default_server.url + "/health", timeout=30).headers["allow"] == "GET, HEAD"
    # a HEAD must change nothing: SGLang's GET /flush_cache flushes, its HEAD is refused
    flush = httpx.head(default_server.url + "/flush_cache", timeout=30)
    assert flush.status_code == 405 and flush.headers["allow"] == "GET, POST"


async def test_health_is_503_while_an_actor_is_stopped_long_before_the_watchdog(
    default_server: Server,
) -> None:
    """It stayed 200 until the watchdog killed the actor (30 s): a load balancer
    kept sending requests that could not complete; then until its silence showed
    (5 s). Now it is 503 from the SIGSTOP on (the kernel's word: stopped)."""
    pid = default_server.actor_pids()["tokenizer0"]

    def actors() -> list[tuple[Any, ...]]:
        info = default_server.info()["actors"]
        return [(a["name"], a["pid"], a["state"], a["restart_count"]) for a in info]

    before = actors()
    answers: list[tuple[float, int, str]] = []
    async with httpx.AsyncClient(base_url=default_server.url, timeout=30) as client:
        started = trio.current_time()
        os.kill(pid, signal.SIGSTOP)
        try:
            with trio.fail_after(15):
                while True:
                    r = await client.get("/health")
                    answers.append((trio.current_time() - started, r.status_code, r.text))
                    if r.status_code == 503:
                        break
                    await trio.sleep(0.1)
            stopped = {a["name"]: a["state"] for a in default_server.info()["actors"]}
            up = metrics(default_server)["rt_actor_up{actor=tokenizer0}"]
        finally:
            os.kill(pid, signal.SIGCONT)
        assert len(answers) == 1, answers  # the first probe
        assert "tokenizer0 is suspended" in answers[0][2], answers
        assert stopped["tokenizer0"] == "suspended", stopped  # /server_info too (said running)
        assert up == 0  # and /metrics (said 1)
        with trio.fail_after(10):
            while (await client.get("/health")).status_code != 200:
                await trio.sleep(0.1)
        out = await client.post(
            "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}}
        )
        assert out.status_code == 200, out.text
    assert actors() == before  # back by itself: nothing restarted


def test_get_model_info_answers_what_sglangs_client_reads(default_server: Server) -> None:
    """SGLang's RuntimeEndpoint reads /get_model_info as it connects (it was a 404)."""
    info = default_server.info()
    for path in ("/get_model_info", "/model_info"):
        model = httpx.get(default_server.url + path, timeout=30).json()
        assert model["model_path"] == info["model"]["path"]
        assert model["tokenizer_path"] == info["model"]["path"]  # (the model's own)
        assert model["is_generation"] is True
        assert model["architectures"] == ["LlamaForCausalLM"] and model["model_type"] == "llama"


def test_server_info(default_server: Server) -> None:
    info = default_server.info()
    assert info["version"]
    assert info["model"]["context_length"] == 512
    assert info["config"]["max_running_requests"] > 0
    assert {a["name"] for a in info["actors"]} == {"tokenizer0", "scheduler", "detokenizer"}
    assert info["server"]["port"] == default_server.port  # (started with --port 0: it said 0)
    for actor in info["actors"]:
        assert actor["state"] == "running"
        assert actor["pid"] > 0
        assert set(actor) >= {"name", "pid", "state", "restart_count", "last_exit_reason"}
    # SGLang's shape beside rt's: its server arguments at the top, and internal_states
    # (its bench reads internal_states[0] after a run: a KeyError ended it before)
    sglang = httpx.get(f"{default_server.url}/get_server_info", timeout=30).json()
    assert sglang["model_path"] == sglang["tokenizer_path"] == info["model"]["path"]  # resolved
    assert sglang["context_length"] == 512 and sglang["tp_size"] == 1
    assert sglang["max_running_requests"] == info["config"]["max_running_requests"]
    assert isinstance(sglang["internal_states"][0], dict)
    # the values in effect where the flags left them to rt (they said null)
    scheduler = info["scheduler"]
    pool = scheduler["request_tokens"] + scheduler["cached_tokens"] + scheduler["free_tokens"]
    assert sglang["max_total_num_tokens"] == pool > 0
    assert sglang["max_req_input_len"] == min(512, pool) - 1
    assert (
        info["server"]["max_connections"]
        == metrics(default_server)["rt_http_max_connections{}"]
        > 0
    )


def test_last_gen_throughput_is_the_decode_rate_as_sglangs(default_server: Server) -> None:
    """sglang.bench_one_batch_server reads internal_states[0]["last_gen_throughput"]
    after its batch (a KeyError ended it): tokens a second over the last decode steps."""
    url = f"{default_server.url}/get_server_info"
    before = httpx.get(url, timeout=30).json()["internal_states"][0].get("steps", 0)
    params = {"max_new_tokens": 60, "ignore_eos": True}
    start = time.monotonic()
    answer = httpx.post(
        f"{default_server.url}/generate",
        json={"text": ["In the beginning"] * 4, "sampling_params": params},
        timeout=60,
    )
    took = time.monotonic() - start
    assert answer.status_code == 200, answer.text
    deadline = time.monotonic() + 30
    while True:  # (reported once the scheduler is idle)
        state = httpx.get(url, timeout=30).json()["internal_states"][0]
        if state["steps"] >= before + 60 and not state["running"] + state["waiting"]:
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    # the client's rate counts the prefill and the HTTP round trip; the steps' does not
    seen = 4 * 60 / took
    assert 0.5 * seen < state["last_gen_throughput"] < 50 * seen, (state, seen)


async def test_a_pause_is_no_decode_time_in_last_gen_throughput(default_server: Server) -> None:
    """A pause in the middle of the window counted as decode time: 29 tokens a second
    after a 5 s pause where 700 were made."""
    url = f"{default_server.url}/get_server_info"
    body = {
        "text": ["In the beginning"] * 4,
        "stream": True,
        "sampling_params": {"max_new_tokens": 30, "ignore_eos": True},
    }  # (one window)
    paused_s = 2.0
    async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
        before = (await client.get(url)).json()["internal_states"][0].get("steps", 0)
        start = time.monotonic()
        async with client.stream("POST", "/generate", json=body) as response:
            pausing = True
            async for line in response.aiter_lines():
                if pausing and line.startswith("data: {"):
                    pausing = False
                    await client.post("/pause_generation", json={"mode": "in_place"})
                    try:
                        await trio.sleep(paused_s)
                    finally:
                        await client.post("/continue_generation")
        took = time.monotonic() - start - paused_s
        with trio.fail_after(30):
            while True:  # (reported once the scheduler is idle)
                state = (await client.get(url)).json()["internal_states"][0]
                if state["steps"] >= before + 30 and not state["running"] + state["waiting"]:
                    break
                await trio.sleep(0.05)
    seen = 4 * 30 / took
    assert state["last_gen_throughput"] > 0.5 * seen, (state, seen)


async def test_server_info_says_where_auto_put_the_engine(default_server: Server) -> None:
    """What rt-chaos reads before judging a server it attached to (rt.chaos.attach):
    outputs of a GPU's kernels are not compared token for token with its CPU replay;
    the replays load the model the server serves; its restart limit bounds the faults."""
    import torch

    from rt.chaos.attach import served

    here = ("cuda", "bfloat16") if torch.cuda.is_available() else ("cpu", "float32")
    server = await served(default_server.url)
    assert (server.device, server.dtype) == here
    assert server.model_path == default_server.info()["model"]["path"]  # (the replays load it)
    assert (server.load_format, server.max_restarts, server.restart_window) == ("auto", 5, 60.0)


def test_metrics_parse_and_move(default_server: Server) -> None:
    before = metrics(default_server)
    # (ignore_eos: a sampled end after 4 tokens made 3 gaps, not 7)
    body = {"text": "And God said", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
    reply = httpx.post(f"{default_server.url}/generate", json=body, timeout=60)
    assert reply.raise_for_status().json()["meta_info"]["completion_tokens"] == 8
    after = metrics(default_server)
    for name in (
        "rt_time_to_first_token_seconds_count{}",
        "rt_e2e_request_latency_seconds_count{}",
        "rt_queue_time_seconds_count{}",
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


async def test_the_scheduler_state_is_reported_while_it_is_busy(default_server: Server) -> None:
    """/server_info and rt_kv_cache_usage used to show the scheduler's last idle
    report (nothing running, no KV held) for as long as it stayed busy."""
    params = {"max_new_tokens": 480, "ignore_eos": True}
    body = {"text": "In the beginning", "sampling_params": params}
    seen: dict[str, Any] = {}
    usage = 0.0
    async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
        done = trio.Event()

        async def load() -> None:
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(partial(client.post, "/generate", json=body))
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(load)
            while not done.is_set() and not seen:
                usage = metrics(default_server)["rt_kv_cache_usage{}"]
                scheduler = (await client.get("/server_info")).json()["scheduler"]
                # (the same report, busy, in both: not a busy one and the idle one after)
                if scheduler is not None and scheduler["running"] >= 1 and usage > 0:
                    seen = scheduler
                await trio.sleep(0.05)
    assert seen, "no report showed a request running, and its KV, while four decoded 480 tokens"
    # (its prompt is its KV from its prefill on, though the prefix tree holds it too:
    # a report right after a prefill said 0)
    assert seen["request_tokens"] >= 3, seen  # ("In the beginning", shared by the four)


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
                    assert abort.json() == {"aborted": 1}, abort.text
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < len(last["output_ids"]) < 400
        # none in flight (it ended): 200 as SGLang's, the call of a client that aborts
        # on its timeout, racing the request's end, must not fail
        missing = await client.post("/abort_request", json={"rid": "to-abort"})
        assert missing.status_code == 200 and missing.json() == {"aborted": 0}
        with trio.fail_after(10):
            while (
                metrics(default_server).get("rt_aborted_requests_total{cause=abort_request}", 0)
                <= before
            ):
                await trio.sleep(0.05)


async def test_pause_holds_streams_and_continue_resumes_them(default_server: Server) -> None:
    body = {
        "text": "In the beginning",
        "stream": True,
        "sampling_params": {"max_new_tokens": 40, "ignore_eos": True, "temperature": 0},
    }
    want = httpx.post(
        f"{default_server.url}/generate", json={**body, "stream": False}, timeout=60
    ).json()
    events: list[dict] = []

    async def read(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", "/generate", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))

    async with (
        httpx.AsyncClient(base_url=default_server.url, timeout=60) as client,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(read, client)
        with trio.fail_after(30):
            while not events:
                await trio.sleep(0.01)
        paused = await client.post("/pause_generation", json={"mode": "in_place"})
        assert paused.status_code == 200 and paused.json()["paused"] is True
        await trio.sleep(0.3)  # the step running as the pause came may still land
        held = len(events)
        await trio.sleep(1.0)
        assert len(events) == held
        assert events[-1]["meta_info"]["finish_reason"] is None
        assert default_server.info()["scheduler"]["paused"] is True
        health = await client.get("/health_generate", timeout=10)  # at once, not after 20 s
        assert health.status_code == 503 and "paused" in health.json()["error"]["message"]
        # no request can complete: a load balancer must not send more here
        health = await client.get("/health")
        assert health.status_code == 503 and "paused" in health.json()["reason"]
        info = default_server.info()
        assert info["paused"] is True and info["healthy"] is False
        resumed = await client.post("/continue_generation")
        assert resumed.status_code == 200 and resumed.json()["paused"] is False
        assert (await client.get("/health_generate")).status_code == 200
        assert (await client.get("/health")).status_code == 200
    assert events[-1]["output_ids"] == want["output_ids"]
    assert all(e["stepped_at"] > 0 for e in events)  # when the scheduler made each delta
    assert default_server.info()["scheduler"]["paused"] is False


async def test_a_pause_as_sglangs_default_aborts_what_is_in_flight(default_server: Server) -> None:
    """An RL trainer's pause, flush, continue: SGLang's pause with no body (mode
    abort) ends what is in flight (finish_reason abort), and a request sent while
    paused waits without KV, so the flush works; that request is served after the
    continue. A bad mode is a 400 that names the ones there are."""
    body = {"text": "In the beginning", "stream": True}
    body["sampling_params"] = {"max_new_tokens": 400, "ignore_eos": True}
    events: list[dict] = []
    async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
        bad = await client.post("/pause_generation", json={"mode": "stop"})
        assert bad.status_code == 400 and "'abort', 'retract' or 'in_place'" in bad.text, bad.text

        async def read() -> None:
            async with client.stream("POST", "/generate", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        events.append(json.loads(line[6:]))

        later: list[httpx.Response] = []
        short = {"text": "x", "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            with trio.fail_after(30):
                while not events:
                    await trio.sleep(0.01)
            paused = await client.post("/pause_generation")
            try:
                assert paused.json() == {
                    "status": "ok",
                    "paused": True,
                    "mode": "abort",
                    "aborted": 1,
                }
                with trio.fail_after(30):
                    while events[-1]["meta_info"]["finish_reason"] is None:
                        await trio.sleep(0.01)
                assert events[-1]["meta_info"]["finish_reason"]["type"] == "abort", events[-1]
                assert len(events[-1]["output_ids"]) < 400
                # one sent while paused waits in the scheduler, holding no KV: the
                # flush goes on (it was refused: "requests are running")
                nursery.start_soon(_append, later, client.post("/generate", json=short))
                with trio.fail_after(30):
                    while not (default_server.info()["scheduler"] or {}).get("waiting"):
                        await trio.sleep(0.02)
                flushed = await client.post("/flush_cache")
                assert flushed.status_code == 200, flushed.text
                assert not later  # held by the pause
            finally:
                assert (await client.post("/continue_generation")).status_code == 200
        assert (
            later[0].status_code == 200 and later[0].json()["meta_info"]["completion_tokens"] == 2
        )


async def _append(into: list[Any], answer: Any) -> None:
    into.append(await answer)


async def test_flush_cache_only_when_idle(default_server: Server) -> None:
    body = {
        "text": "And the earth was without form",
        "stream": True,
        "rid": "busy",
        "sampling_params": {"max_new_tokens": 400, "ignore_eos": True},
    }
    busy = None
    async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
        async with client.stream("POST", "/generate", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {") and busy is None:
                    busy = await client.post("/flush_cache")
                    await client.post("/abort_request", json={"rid": "busy"})
        assert busy is not None
        assert busy.status_code == 400
        assert "requests are running" in busy.json()["error"]["message"]
        with trio.fail_after(30):
            while default_server.info()["requests_in_flight"]:
                await trio.sleep(0.05)
        prompt = {
            "text": "And God said",
            "sampling_params": {"max_new_tokens": 2, "temperature": 0},
        }
        (await client.post("/generate", json=prompt)).raise_for_status()
        cached = (await client.post("/generate", json=prompt)).json()
        assert cached["meta_info"]["cached_tokens"] > 0
        with trio.fail_after(30):  # the scheduler may still hold the last request a moment
            while (flushed := await client.post("/flush_cache")).status_code == 400:
                await trio.sleep(0.05)
        assert flushed.status_code == 200
        fresh = (await client.post("/generate", json=prompt)).json()
        assert fresh["meta_info"]["cached_tokens"] == 0
        assert fresh["output_ids"] == cached["output_ids"]


def test_a_control_body_past_its_limit_is_413_and_changes_nothing(default_server: Server) -> None:
    """A control's body is a small JSON object: past 64 KiB it is refused before it
    is read whole (not up to --max-body-size, a prompt's limit), and pauses nothing."""
    body = {"mode": "in_place", "pad": "x" * (80 << 10)}
    refused = httpx.post(f"{default_server.url}/pause_generation", json=body, timeout=30)
    assert refused.status_code == 413, refused.text
    message = refused.json()["error"]["message"]
    assert "65536" in message and "/pause_generation takes a small JSON object" in message
    assert httpx.get(f"{default_server.url}/health", timeout=30).status_code == 200


def test_unknown_endpoint_and_method(default_server: Server) -> None:
    missing = httpx.get(f"{default_server.url}/nope", timeout=30)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"
    wrong = httpx.get(f"{default_server.url}/generate", timeout=30)
    assert wrong.status_code == 405
    assert wrong.headers["allow"] == "POST, PUT"


def test_openapi_document(default_server: Server) -> None:
    doc = httpx.get(f"{default_server.url}/openapi.json", timeout=30).json()
    assert doc["openapi"].startswith("3.")
    for path in ("/generate", "/v1/completions", "/v1/chat/completions", "/health", "/ws"):
        assert path in doc["paths"], path
    # a control's body is optional (it was required in the document for two that need none)
    for path in ("/pause_generation", "/flush_cache", "/continue_generation"):
        assert doc["paths"][path]["post"]["requestBody"]["required"] is False, path
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    ref = body["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert "messages" in schema["properties"]


async def test_abort_request_by_a_batchs_rid_aborts_each_of_its_prompts(
    default_server: Server,
) -> None:
    body = {
        "text": ["In the beginning", "And the earth"],
        "rid": "batch-to-abort",
        "stream": True,
        "sampling_params": {"max_new_tokens": 400, "ignore_eos": True},
    }
    async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
        finished: dict[int, dict] = {}
        async with client.stream("POST", "/generate", json=body) as response:
            aborted = False
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if not aborted:  # the prompts' rids are batch-to-abort-0 and -1
                    abort = await client.post("/abort_request", json={"rid": "batch-to-abort"})
                    assert abort.status_code == 200, abort.text
                    assert abort.json() == {"aborted": 2}
                    aborted = True
                if event["meta_info"]["finish_reason"] is not None:
                    finished[event["index"]] = event
        assert sorted(finished) == [0, 1]
        for event in finished.values():
            assert event["meta_info"]["finish_reason"]["type"] == "abort"
            assert len(event["output_ids"]) < 400


async def test_abort_request_by_a_rid_a_batch_shares_with_a_request_aborts_them_all(
    default_server: Server,
) -> None:
    """A batch may be named as a single request in flight (its prompts' rids are
    ``dup-0``, ``dup-1``): the abort of ``dup`` ended the single one only, and the
    batch ran to its end."""
    params = {"max_new_tokens": 480, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=default_server.url, timeout=300) as client:
        done: dict[str, list[str]] = {}

        async def send(name: str, text: str | list[str]) -> None:
            body = {"text": text, "rid": "dup", "sampling_params": params}
            out = (await client.post("/generate", json=body)).json()
            done[name] = (
                [o["meta_info"]["finish_reason"]["type"] for o in out]
                if isinstance(out, list)
                else [out["meta_info"]["finish_reason"]["type"]]
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "single", "And God said")
            nursery.start_soon(send, "batch", ["In the beginning", "And the earth"])
            while metrics(default_server).get("rt_num_running_reqs{}", 0) < 3:
                await trio.sleep(0.05)
            abort = await client.post("/abort_request", json={"rid": "dup"})
            assert abort.json() == {"aborted": 3}, abort.text
        assert done == {"single": ["abort"], "batch": ["abort", "abort"]}, done


async def test_a_streamed_batch_goes_on_when_one_prompt_is_aborted_before_its_ids_came(
    default_server: Server,
) -> None:
    """The stream waits for every prompt to be tokenized before its status line; one
    aborted before its ids came never was, and the stream hung (6 of 8 tries)."""
    pid = default_server.actor_pids()["tokenizer0"]
    body = {"prompt": ["Hello there", "Once upon a time"], "max_tokens": 4, "stream": True}
    body["ignore_eos"] = True  # (prompt 1 must end at its length, not at a sampled end)
    async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
        answers: list[httpx.Response] = []

        async def ask() -> None:
            answers.append(await client.post("/v1/completions", json={**body, "rid": "half"}))

        os.kill(pid, signal.SIGSTOP)  # the prompts wait for their ids
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask)
                await trio.sleep(0.5)
                abort = await client.post("/abort_request", json={"rid": "half-0"})
                assert abort.json() == {"aborted": 1}
                os.kill(pid, signal.SIGCONT)
                with trio.fail_after(30):
                    while not answers:
                        await trio.sleep(0.05)
        finally:
            os.kill(pid, signal.SIGCONT)
    (answer,) = answers
    assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
    events = [json.loads(x[6:]) for x in answer.text.splitlines() if x.startswith("data: {")]
    finish = {c["index"]: c["finish_reason"] for e in events for c in e["choices"]}
    assert finish[0] == "abort" and finish[1] == "length", finish


async def test_abort_request_by_a_prefix_of_rids_clients_chose_aborts_nothing(
    default_server: Server,
) -> None:
    """``job-1`` and ``job-2``, sent on their own, are no batch ``job``'s prompts."""
    params = {"max_new_tokens": 480, "ignore_eos": True}
    # (1-2 s alone; beside a test running an engine core on both cores, over 60 s)
    async with httpx.AsyncClient(base_url=default_server.url, timeout=300) as client:
        async with trio.open_nursery() as nursery:
            done: dict[str, str] = {}

            async def send(rid: str) -> None:
                body = {"text": "And God said", "rid": rid, "sampling_params": params}
                out = (await client.post("/generate", json=body)).json()
                done[rid] = out["meta_info"]["finish_reason"]["type"]

            for rid in ("job-1", "job-2"):
                nursery.start_soon(send, rid)
            while metrics(default_server).get("rt_num_running_reqs{}", 0) < 2:
                await trio.sleep(0.05)
            missing = await client.post("/abort_request", json={"rid": "job"})
            assert missing.json() == {"aborted": 0}, missing.text
            huge = await client.post("/abort_request", json={"rid": "j" * 500_000})
            assert huge.json() == {"aborted": 0}, huge.text[:200]
        assert done == {"job-1": "length", "job-2": "length"}


async def test_a_request_aborted_while_paused_counts_its_prompt(default_server: Server) -> None:
    """Aborted before its first token (generation paused), its usage said
    ``prompt_tokens: 0``: the counts came from its first chunk only. So did
    ``return_token_ids``' prompt ids (null; in a stream, in no chunk)."""
    body = {"prompt": "And God said, Let there be light", "max_tokens": 4, "rid": "paused-abort"}
    body["return_token_ids"] = True
    chat = {"messages": [{"role": "user", "content": "And God said"}], "max_tokens": 4, "n": 2}
    chat |= {"stream": True, "return_token_ids": True, "request_id": "paused-chat"}
    async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
        answers: list[httpx.Response] = []
        chunks: list[Any] = []

        async def ask() -> None:
            answers.append(await client.post("/v1/completions", json=body))

        async def stream() -> None:
            async with client.stream("POST", "/v1/chat/completions", json=chat) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        chunks.append(json.loads(line[6:]))

        pause = await client.post("/pause_generation", json={"mode": "in_place"})
        assert pause.status_code == 200
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask)
                nursery.start_soon(stream)
                with trio.fail_after(30):  # in the paused scheduler: its prompts tokenized
                    while (default_server.info()["scheduler"] or {}).get("requests", 0) < 2:
                        await trio.sleep(0.05)
                await trio.sleep(0.2)  # (the ids reach the front beside it, on another ring)
                for rid in ("paused-abort", "paused-chat"):
                    abort = await client.post("/abort_request", json={"rid": rid})
                    assert abort.json() == {"aborted": 1}, abort.text
        finally:
            await client.post("/continue_generation")
    (answer,) = answers
    assert answer.status_code == 200, answer.text
    out = answer.json()
    assert out["choices"][0]["finish_reason"] == "abort"
    assert out["usage"]["prompt_tokens"] > 5
    assert len(out["choices"][0]["prompt_token_ids"]) == out["usage"]["prompt_tokens"]
    assert len(chunks[0]["prompt_token_ids"]) > 5, chunks[0]
    ends = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"]]
    assert [(e["index"], e["finish_reason"], e["token_ids"]) for e in ends] == [
        (0, "abort", []),
        (1, "abort", []),
    ], chunks


async def test_a_controls_body_is_read_when_it_has_one(default_server: Server) -> None:
    """/continue_generation and /flush_cache answered 200 to any body (invalid JSON,
    a field unknown), where the other controls name what is wrong; an abort_all
    with rid null was refused as a rid that is no string."""
    async with httpx.AsyncClient(base_url=default_server.url, timeout=30) as client:
        for path in ("/continue_generation", "/flush_cache"):
            bad = (
                (b"\xff", "not valid JSON"),
                (b'{"x": 1}', "x: "),
                (b"[]", "must be a JSON object"),
            )
            for body, says in bad:
                answer = await client.post(path, content=body)
                message = answer.json()["error"]["message"] if answer.status_code == 400 else ""
                assert says in message, (path, body, answer.text)
            assert (await client.post(path, content=b"{}")).status_code == 200, path
            assert (await client.post(path)).status_code == 200, path  # (no body: as before)
        answer = await client.post("/continue_generation", json={"torch_empty_cache": False})
        assert answer.status_code == 200, answer.text  # SGLang's field: asks nothing here
        answer = await client.post("/abort_request", json={"rid": None, "abort_all": True})
        assert answer.status_code == 200 and answer.json() == {"aborted": 0}, answer.text

"""Bad input never takes anything down and never gets a 5xx: a listed case
each gets a 4xx whose message names the field; then a hypothesis fuzzer
(bounded: ``derandomize``, a fixed number of examples, small token budgets)
sends arbitrary bodies to every endpoint (a stream's error events included)
and arbitrary frames to /ws, and afterwards no actor has restarted, the log
has no traceback and the server is healthy. On the shared default-model server."""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serverlib import Server
from trio_websocket import open_websocket_url

FUZZ_BUDGET_S = 25.0
WS_FUZZ_BUDGET_S = 15.0
ONE = {"max_new_tokens": 2}
MSG = [{"role": "user", "content": "hi"}]
# (path, body (a dict, or raw bytes), a word the error message must contain)
CASES: list[tuple[str, Any, str]] = [
    ("/generate", b'{"text": ', "JSON"),
    ("/generate", b"\xff\xfe", "JSON"),
    ("/generate", b"[]", "object"),
    ("/generate", b"[" * 100_000, "deeply"),
    ("/generate", {"sampling_params": ONE}, "text"),
    (
        "/generate",
        {"text": "x", "input_ids": [1], "sampling_params": ONE},
        "one of text or input_ids, got both",
    ),
    ("/generate", {"sampling_params": ONE, "stream": True}, "got neither"),
    ("/generate", {"text": 5}, "text"),
    ("/generate", {"text": [], "sampling_params": ONE}, "empty"),
    ("/generate", {"input_ids": [], "sampling_params": ONE}, "input_ids"),
    ("/generate", {"input_ids": [10**9]}, "input_ids[0]"),
    ("/generate", {"input_ids": [-1]}, "input_ids[0]"),
    ("/generate", {"text": "\ud800", "sampling_params": ONE}, "surrogate"),
    ("/generate", {"text": "x" * 3000, "sampling_params": ONE}, "context"),
    ("/generate", {"text": "x", "sampling_params": {"temperature": "hot"}}, "temperature"),
    ("/generate", {"text": "x", "sampling_params": {"temperature": -1}}, "temperature"),
    ("/generate", {"text": "x", "sampling_params": {"temperature": float("nan")}}, "temperature"),
    ("/generate", {"text": "x", "sampling_params": {"top_p": 0}}, "top_p"),
    ("/generate", {"text": "x", "sampling_params": {"top_k": 1.5}}, "top_k"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    (
        "/generate",
        {"text": "x", "sampling_params": {"max_new_tokens": 0, "min_new_tokens": 1}},
        "min",
    ),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 10**30}}, "max_new_tokens"),
    ("/generate", {"text": "x", "sampling_params": {"n": 0}}, "n"),
    ("/generate", {"text": "x", "sampling_params": {"n": 2.5}}, "n"),
    # a huge n once made the server allocate n result slots before the engine
    # refused it: the main process hung (found by rt-chaos --duration 10m --seed 7)
    ("/generate", {"text": "x", "sampling_params": {"n": 2**63}}, "n"),
    ("/generate", {"text": "x", "sampling_params": {"n": 10**9}}, "n"),
    ("/generate", {"text": "x", "sampling_params": {"ignore_eos": 1}}, "ignore_eos"),
    ("/generate", {"text": "x", "sampling_params": {"frequency_penalty": 3}}, "frequency_penalty"),
    ("/generate", {"text": "x", "sampling_params": {"tempreature": 1}}, "tempreature"),
    ("/generate", {"text": "x", "sampling_params": {"stop": ""}}, "stop"),
    ("/generate", {"text": "x", "sampling_params": {"stop": [1]}}, "stop"),
    ("/generate", {"text": "x", "sampling_params": {"logit_bias": {"abc": 1}}}, "logit_bias"),
    ("/generate", {"text": "x", "sampling_params": {"seed": -1}}, "seed"),
    ("/generate", {"text": "x", "sampling_params": {"stop_token_ids": [99999]}}, "stop_token_ids"),
    ("/generate", {"text": "x", "bogus": 1}, "bogus"),
    ("/generate", {"text": "x", "top_logprobs_num": -1, "return_logprob": True}, "top_logprobs"),
    ("/generate", {"text": ["a", "b"], "sampling_params": [ONE]}, "sampling_params"),
    ("/generate", {"text": "x", "logprob_start_len": -2, "return_logprob": True}, "logprob_start"),
    # past the prompt's last position: once 200 with no prompt logprobs; SGLang refuses it
    ("/generate", {"input_ids": [5, 6, 7], "logprob_start_len": 3, "return_logprob": True}, "3 t"),
    ("/generate", {"text": "x", "logprob_start_len": 50, "return_logprob": True}, "got 50"),
    ("/v1/completions", {}, "prompt"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": [[]]}, "prompt"),
    ("/v1/completions", {"prompt": [1, "a"]}, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "logprobs": 99999}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "best_of": 3}, "best_of"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "suffix": "y"}, "suffix"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, "stream"),
    ("/v1/completions", {"prompt": "x", "min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "content"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "role"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "robot"),
    ("/v1/chat/completions", {"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MSG, "max_completion_tokens": 0}, "max_completion"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json"}}, "response"),
    # (it said "unknown field" here, where vLLM takes it)
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_object"}}, "only {'t"),
    ("/v1/chat/completions", {"messages": MSG, "n": 99999}, "n"),
    ("/v1/chat/completions", {"messages": MSG, "n": 2**63}, "n"),
    ("/v1/completions", {"prompt": "x", "n": 2**63}, "n"),
    # every output of a request repeats its rid (a 2 MB rid: 190 MB sent for 100 tokens)
    ("/generate", {"text": "x", "rid": "r" * 1025, "sampling_params": ONE}, "at most 1024"),
    ("/generate", {"text": "x", "rid": "r" * 1025, "stream": True}, "at most 1024"),
    ("/v1/completions", {"prompt": "x", "rid": "r" * 1025, "stream": True}, "at most 1024"),
    # a batch's: its prompts' rids add "-i" (it named 1026 characters, not what was sent)
    ("/generate", {"text": ["x"], "rid": "r" * 1023}, "at most 1022 characters for a batch of 1"),
    ("/v1/completions", {"prompt": ["x", "y"], "rid": "r" * 1024}, "got 1024"),
    ("/abort_request", {"rid": 5}, "rid"),
    ("/abort_request", {}, "rid"),
]


@pytest.fixture(scope="module")
def client(default_server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=default_server.url, timeout=60) as c:
        yield c


def post(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    if isinstance(body, bytes):
        return client.post(path, content=body)
    return client.post(path, content=json.dumps(body))  # json.dumps: NaN and lone surrogates pass


@pytest.mark.parametrize(
    ("path", "body", "needle"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_bad_input_is_a_4xx_that_names_it(
    client: httpx.Client, path: str, body: Any, needle: str
) -> None:
    response = post(client, path, body)
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert needle in error["message"], error


@pytest.mark.parametrize(
    ("path", "field", "extra"),
    [
        ("/v1/completions", "prompt", {"max_tokens": 4}),
        ("/generate", "text", {"sampling_params": {"max_new_tokens": 4}}),
    ],
)
def test_a_streamed_batch_with_one_prompt_over_the_context_is_a_plain_400(
    client: httpx.Client, path: str, field: str, extra: dict[str, Any]
) -> None:
    """The status line waited for the first token of any prompt: a short prompt's
    could come before the long one's refusal, and the answer was then a 200 with an
    error event, a third of the time. It now waits until the engine has taken every
    prompt, as vLLM checks them all before its stream starts."""
    body = {field: ["a"] * 16 + ["x y " * 1500], "stream": True, **extra}
    for _ in range(6):
        response = post(client, path, body)
        assert response.status_code == 400, response.text[:300]
        assert response.json()["error"]["param"] == f"{field}[16]"


def test_a_refused_value_is_quoted_short(client: httpx.Client) -> None:
    """A refused response_format (or modalities) was quoted whole in the message: a
    15 MiB value came back as a 15 MiB error."""
    for field, value in (
        ("response_format", {"type": "x" * 1_000_000}),
        ("modalities", ["x"] * 1000),
    ):
        response = post(client, "/v1/chat/completions", {"messages": MSG, field: value})
        assert response.status_code == 400 and len(response.text) < 1000, response.text[:300]
        assert response.json()["error"]["param"] == field


# (path, a bad body, where the error must say the fault is: its param; in a batch, its prompt)
NAMED: list[tuple[str, Any, str]] = [
    ("/generate", {"input_ids": [[1], [2], [4096]], "sampling_params": ONE}, "input_ids[2][0]"),
    ("/generate", {"text": ["ok", "\ud800"], "sampling_params": ONE}, "text[1]"),
    ("/generate", {"text": ["ok", "x" * 3000], "sampling_params": ONE}, "text[1]"),
    (
        "/generate",
        {"text": ["a", "b"], "sampling_params": [ONE, {**ONE, "temperature": -1}]},
        "sampling_params[1].temperature",
    ),
    (
        "/generate",
        {"text": ["a", "b"], "sampling_params": {**ONE, "top_p": 0}},
        "sampling_params.top_p",
    ),
    ("/v1/completions", {"prompt": [[1], [4096]], "max_tokens": 2}, "prompt[1][0]"),
    ("/v1/completions", {"prompt": ["a", "x" * 3000], "max_tokens": 2}, "prompt[1]"),
    # a list of one prompt is a list all the same (it said prompt[1])
    ("/v1/completions", {"prompt": [[1, 4096]], "max_tokens": 2}, "prompt[0][1]"),
    ("/v1/completions", {"prompt": [[1, 4096]], "max_tokens": 2, "echo": True}, "prompt[0][1]"),
    ("/v1/completions", {"prompt": [1, 4096], "max_tokens": 2, "echo": True}, "prompt[1]"),
    ("/v1/completions", {"prompt": [[1], [4096]], "max_tokens": 2, "echo": True}, "prompt[1][0]"),
    # one prompt: the field as the body has it, not as the engine does
    (
        "/generate",
        {"text": "x", "sampling_params": {"max_new_tokens": -1}},
        "sampling_params.max_new_tokens",
    ),
    (
        "/generate",
        {"text": "x", "sampling_params": {"temperature": -1}},
        "sampling_params.temperature",
    ),
    (
        "/generate",
        {"text": "x", "sampling_params": {"stop_token_ids": [1, 99999]}},
        "sampling_params.stop_token_ids",
    ),
    (
        "/generate",
        {"text": "x", "top_logprobs_num": -1, "return_logprob": True},
        "top_logprobs_num",
    ),
    ("/generate", {"text": "x", "priority": 3}, "priority"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "logprobs": -1}, "logprobs"),
    # found by a hostile review: each was unbounded, or named another field, or none
    # (7.8M stop ids held the event loop a second and 1 GB a request)
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [7] * 70_000}, "stop_token_ids"),
    (
        "/generate",
        {"text": "x", "sampling_params": {"stop_token_ids": [7] * 70_000}},
        "sampling_params.stop_token_ids",
    ),
    ("/tokenize", {"prompt": "a\ud800"}, "prompt"),  # (was the tokenizer's TypeError)
    ("/tokenize", {"prompt": ["a", "b\udfff"]}, "prompt[1]"),
    ("/generate", {"text": ["a", "b", "c"], "rid": ["r", "s", "r"]}, "rid[2]"),  # ("in flight")
    (
        "/v1/chat/completions",
        {"messages": MSG, "continue_final_message": True, "add_generation_prompt": True},
        "continue_final_message",  # (was chat_template_kwargs, which the body has not)
    ),
    (  # (was the prompt's length: "or send truncate_prompt_tokens", which it had sent)
        "/v1/completions",
        {"prompt": "x " * 600, "truncate_prompt_tokens": 1000},
        "truncate_prompt_tokens",
    ),
    (
        "/v1/completions",
        {"prompt": "x", "truncate_prompt_tokens": 10**30},
        "truncate_prompt_tokens",
    ),
]


@pytest.mark.parametrize(("path", "body", "name"), NAMED)
def test_an_error_names_the_field_as_the_body_has_it(
    client: httpx.Client, path: str, body: Any, name: str
) -> None:
    response = post(client, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == name and error["message"].startswith(f"{name}: "), error


def test_an_empty_rid_is_none_given(client: httpx.Client) -> None:
    """As the OpenAI endpoints take it: two requests with ``rid: ""`` at once
    are two requests (the second was refused: "'' is already in flight")."""
    body = {
        "text": "In the",
        "rid": "",
        "sampling_params": {"max_new_tokens": 64, "ignore_eos": True},
    }
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: post(client, "/generate", body), range(4)))
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    assert len({a.json()["meta_info"]["id"] for a in answers}) == 4


# ---- the fuzzer ------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
SMALL = st.integers(1, 3)
JUNK_INT = (
    st.integers(max_value=0)
    | st.integers(min_value=10**6)
    | st.floats()
    | st.text(max_size=3)
    | st.booleans()
)
TOKENS = SMALL | JUNK_INT  # a budget: small, or not one that generates
PROMPT = st.text(max_size=30) | st.lists(st.integers(-5, 5000), max_size=8) | JSON


def fields(**strategies: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with some of these keys, sometimes an unknown one."""
    keys = st.fixed_dictionaries({}, optional={k: v | JSON for k, v in strategies.items()})
    return st.one_of(keys, st.builds(lambda d, k, v: {**d, k: v}, keys, st.text(max_size=6), JSON))


SAMPLING = fields(
    temperature=st.floats(0, 2),
    top_p=st.floats(0, 1),
    top_k=st.integers(-1, 50),
    min_p=st.floats(0, 1),
    frequency_penalty=st.floats(-2, 2),
    presence_penalty=st.floats(-2, 2),
    repetition_penalty=st.floats(0, 2),
    stop=st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=3),
    stop_token_ids=st.lists(st.integers(-1, 5000), max_size=3),
    ignore_eos=st.booleans(),
    skip_special_tokens=st.booleans(),
    n=SMALL | JUNK_INT,
    seed=st.integers(-1, 2**64),
    logit_bias=st.dictionaries(st.text(max_size=4), st.floats(-200, 200), max_size=2),
).map(lambda d: {**d, "max_new_tokens": d.get("max_new_tokens", 2)})
OPENAI = {
    "max_tokens": TOKENS,
    "temperature": st.floats(0, 2),
    "n": SMALL | JUNK_INT,
    "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=3),
    "seed": st.integers(-1, 2**64),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | JSON,
    "logit_bias": st.dictionaries(st.text(max_size=4), st.floats(-200, 200), max_size=2),
    "model": st.just("default") | st.text(max_size=5),
}
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "robot"]) | JSON},
    optional={"content": st.text(max_size=20) | JSON, "name": JSON},
)
GENERATE = fields(
    text=PROMPT,
    input_ids=st.lists(st.integers(-5, 5000), max_size=8),
    stream=st.booleans(),
    return_logprob=st.booleans(),
    top_logprobs_num=st.integers(-1, 5),
    rid=st.text(max_size=8),
).flatmap(lambda d: SAMPLING.map(lambda s: {**d, "sampling_params": s}))
BODIES = st.one_of(
    st.tuples(st.just("/generate"), GENERATE),
    st.tuples(
        st.just("/v1/completions"),
        fields(prompt=PROMPT, echo=st.booleans(), logprobs=st.integers(-1, 5), **OPENAI).map(
            lambda d: {**d, "max_tokens": d.get("max_tokens", 2)}
        ),
    ),
    st.tuples(
        st.just("/v1/chat/completions"),
        fields(
            messages=st.lists(MESSAGE, max_size=3),
            logprobs=st.booleans(),
            top_logprobs=st.integers(-1, 5),
            **OPENAI,
        ).map(lambda d: {**d, "max_tokens": d.get("max_tokens", 2)}),
    ),
    st.tuples(st.just("/abort_request"), fields(rid=st.text(max_size=8), abort_all=st.booleans())),
    st.tuples(
        st.just("/tokenize"),
        fields(
            prompt=PROMPT,
            text=PROMPT,
            add_special_tokens=st.booleans() | JSON,
            return_token_strs=st.booleans() | JSON,
            messages=st.lists(MESSAGE, max_size=2),
            model=OPENAI["model"],
        ),
    ),
    st.tuples(
        st.just("/detokenize"),
        fields(tokens=st.lists(st.integers(-5, 5000), max_size=8) | PROMPT | JSON),
    ),
    st.tuples(
        st.sampled_from(
            [
                "/generate",
                "/v1/completions",
                "/v1/chat/completions",
                "/abort_request",
                "/flush_cache",
                "/tokenize",
                "/detokenize",
            ]
        ),
        st.binary(max_size=64),
    ),
)


def fuzzing(examples: int) -> Any:
    """Bounded and the same every run: a fixed number of examples, derandomized."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


def test_fuzz_every_endpoint(default_server: Server, client: httpx.Client) -> None:
    restarts = {a["name"]: a["restart_count"] for a in default_server.info()["actors"]}
    deadline = time.monotonic() + FUZZ_BUDGET_S

    @fuzzing(400)
    @given(BODIES)
    def no_5xx(case: tuple[str, Any]) -> None:
        if time.monotonic() > deadline:
            return  # out of time: the remaining examples are drawn but not sent
        path, body = case
        response = post(client, path, body)
        assert response.status_code < 500, (path, body, response.text)
        # a stream's error after its first event is an event, under the 200
        assert not any(_is_5xx(e) for e in events(response)), (path, body, response.text)

    logged = len(default_server.log)
    no_5xx()
    assert not [line for line in default_server.log[logged:] if "Traceback" in line]
    for method, path in [("GET", "/health"), ("GET", "/health_generate"), ("GET", "/server_info")]:
        assert client.request(method, path).status_code == 200
    assert {a["name"]: a["restart_count"] for a in default_server.info()["actors"]} == restarts
    assert default_server.info()["requests_in_flight"] == 0


def events(response: httpx.Response) -> list[Any]:
    """The JSON events of a server-sent event stream (none for another body)."""
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        return []
    return [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")
    ]


def _is_5xx(event: dict[str, Any]) -> bool:
    code = event.get("error", {}).get("code") if isinstance(event.get("error"), dict) else None
    return isinstance(code, int) and code >= 500


# WebSocket frames: generate bodies under ids that collide, cancels, and junk text or bytes
WS_ID = st.sampled_from(["a", "b", 1]) | JSON
WS_FRAMES = st.lists(
    st.builds(
        lambda body, cid, kind: json.dumps({**body, "id": cid, "type": kind}),
        GENERATE,
        WS_ID,
        st.sampled_from(["generate", "generate", "cancel"]) | JSON,
    )
    | st.builds(lambda cid: json.dumps({"id": cid, "type": "cancel"}), WS_ID)
    | st.text(max_size=40)
    | st.binary(max_size=40),
    min_size=1,
    max_size=6,
)


async def _ws_round(port: int, frames: list[str | bytes], n: int) -> list[dict[str, Any]]:
    """Send ``frames`` on one connection, then a one-token request, and read up to
    its ``done``: the connection must carry it whatever came before."""
    sentinel = f"sentinel-{n}"
    replies = []
    async with open_websocket_url(f"ws://127.0.0.1:{port}/ws") as ws:
        for frame in frames:
            await ws.send_message(frame)
        last = {"id": sentinel, "type": "generate", "input_ids": [5], "sampling_params": ONE}
        await ws.send_message(json.dumps(last))
        with trio.fail_after(60):
            while True:
                reply = json.loads(await ws.get_message())
                replies.append(reply)
                if reply.get("id") == sentinel and reply["type"] in ("done", "error"):
                    break
    assert reply["type"] == "done", reply
    return replies


def test_fuzz_websocket_frames(default_server: Server, client: httpx.Client) -> None:
    """Arbitrary frames on one connection: each bad one an error frame under 500,
    and the connection still serves the next request."""
    restarts = {a["name"]: a["restart_count"] for a in default_server.info()["actors"]}
    deadline = time.monotonic() + WS_FUZZ_BUDGET_S
    rounds = itertools.count()

    @fuzzing(200)
    @given(WS_FRAMES)
    def no_5xx(frames: list[str | bytes]) -> None:
        if time.monotonic() > deadline:
            return
        replies = trio.run(_ws_round, default_server.port, frames, next(rounds))
        bad = [r for r in replies if r["type"] == "error" and r["status"] >= 500]
        assert not bad, (frames, bad)

    logged = len(default_server.log)
    no_5xx()
    assert next(rounds) > 10  # examples ran, not only drawn
    assert not [line for line in default_server.log[logged:] if "Traceback" in line]
    assert client.get("/health").status_code == 200
    assert {a["name"]: a["restart_count"] for a in default_server.info()["actors"]} == restarts
    for _ in range(100):  # each connection's requests end as it closes
        if default_server.info()["requests_in_flight"] == 0:
            break
        time.sleep(0.1)
    assert default_server.info()["requests_in_flight"] == 0


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/completions", {"prompt": "x", "max_tokens": 2, "logprobs": "K"}, "logprobs"),
        (
            "/v1/chat/completions",
            {"messages": MSG, "max_tokens": 2, "logprobs": True, "top_logprobs": "K"},
            "top_logprobs",
        ),
        (
            "/generate",
            {
                "text": "x",
                "sampling_params": {"max_new_tokens": 2},
                "return_logprob": True,
                "top_logprobs_num": "K",
            },
            "top_logprobs_num",
        ),
    ],
)
def test_top_logprobs_past_the_servers_max_is_refused_by_name(
    client: httpx.Client, path: str, body: dict[str, Any], field: str
) -> None:
    # Before, up to 1024 a token were taken: ~130 MB of the front's memory per sample of
    # 500 tokens, from a body of 150 bytes (n=32: 4.3 GB). vLLM's --max-logprobs is 20.
    def asking(k: int) -> dict[str, Any]:
        return json.loads(json.dumps(body).replace('"K"', str(k)))

    response = post(client, path, asking(21))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field
    assert error["message"].startswith(f"{field}: expected at most 20 (the server's max_logprobs)")
    assert post(client, path, asking(20)).status_code == 200


def test_a_max_tokens_that_fills_the_context_alone_is_named_not_the_prompt(
    client: httpx.Client,
) -> None:
    """Its fault alone: no prompt, cut or not, leaves it room. In a list of prompts
    it was blamed on the first prompt (param prompt[0]), and with no cut allowed the
    advice was to shorten the prompt or start the server with auto-truncation."""
    for prompt in ("hello", ["hello"], ["a", "b"], [[5] * 10], [5] * 10):
        answer = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 600})
        error = answer.json()["error"]
        assert answer.status_code == 400 and error["param"] == "max_tokens", (prompt, error)
        assert error["message"].startswith("max_tokens is 600, which leaves no room"), error
        assert error["message"].endswith("; lower max_tokens"), error
    batch = {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 600}}
    error = client.post("/generate", json=batch).json()["error"]
    assert error["param"] == "sampling_params.max_new_tokens", error
    each = {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 5}, {"max_new_tokens": 600}]}
    error = client.post("/generate", json=each).json()["error"]
    assert error["param"] == "sampling_params[1].max_new_tokens", error  # (it was text[1])
    assert error["message"].startswith("sampling_params[1].max_new_tokens is 600"), error

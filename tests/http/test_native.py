"""SGLang's native ``/generate`` against rt-serve on the default model."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
from serverlib import Server
from tokenizers import Tokenizer

import rt
from rt.assets import default_model_path

GREEDY = {"max_new_tokens": 16, "temperature": 0.0}


def generate(server: Server, body: dict[str, Any]) -> Any:
    response = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def events(server: Server, body: dict[str, Any]) -> list[Any]:
    """Every SSE event's data, parsed; the last must be [DONE]."""
    out: list[Any] = []
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:])
    assert out[-1] == "[DONE]"
    return [json.loads(e) for e in out[:-1]]


def test_text(default_server: Server) -> None:
    out = generate(default_server, {"text": "And God said", "sampling_params": GREEDY})
    assert out["text"] and len(out["output_ids"]) == 16
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 16}
    assert meta["prompt_tokens"] > 0
    assert meta["completion_tokens"] == 16
    assert meta["e2e_latency"] > 0
    assert isinstance(meta["id"], str)


def test_a_stop_string_is_trimmed_unless_no_stop_trim(default_server: Server) -> None:
    text = generate(default_server, {"text": "And God said", "sampling_params": GREEDY})["text"]
    stop = text.split()[2]  # a word from the middle of the greedy text
    for trim, want in (
        (None, text[: text.index(stop)]),
        (True, text[: text.index(stop) + len(stop)]),
    ):
        params = {**GREEDY, "stop": stop, "no_stop_trim": trim}
        out = generate(default_server, {"text": "And God said", "sampling_params": params})
        assert out["text"] == want
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_a_stop_token_is_in_the_ids_and_out_of_the_text_unless_no_stop_trim(
    default_server: Server,
) -> None:
    """As vLLM and SGLang answer: the text used to end with the stop token's own."""
    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    ids = generate(default_server, {"text": "And God said", "sampling_params": GREEDY})[
        "output_ids"
    ]
    stop = ids[3]
    at = ids.index(stop)
    for trim, want in ((None, ids[:at]), (True, ids[: at + 1])):
        params = {**GREEDY, "stop_token_ids": [stop], "no_stop_trim": trim}
        body = {"text": "And God said", "sampling_params": params}
        out = generate(default_server, body)
        assert out["output_ids"] == ids[: at + 1]
        assert out["text"] == tokenizer.decode(want)
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert events(default_server, {**body, "stream": True})[-1]["text"] == out["text"]


def test_input_ids_give_what_the_text_gives(default_server: Server) -> None:
    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    ids = tokenizer.encode("And God said").ids
    by_text = generate(default_server, {"text": "And God said", "sampling_params": GREEDY})
    by_ids = generate(default_server, {"input_ids": ids, "sampling_params": GREEDY})
    assert by_ids["meta_info"]["prompt_tokens"] == by_text["meta_info"]["prompt_tokens"]
    assert by_ids["output_ids"] == by_text["output_ids"]


def test_batch_gives_a_list_in_order(default_server: Server) -> None:
    prompts = ["And God said", "In the beginning", "The LORD is"]
    outs = generate(default_server, {"text": prompts, "sampling_params": GREEDY, "rid": "batch"})
    assert [o["index"] for o in outs] == [0, 1, 2]
    assert [o["meta_info"]["id"] for o in outs] == ["batch-0", "batch-1", "batch-2"]
    for prompt, out in zip(prompts, outs, strict=True):
        alone = generate(default_server, {"text": prompt, "sampling_params": GREEDY})
        assert out["text"] == alone["text"]


def test_n2_gives_a_list(default_server: Server) -> None:
    params = {"max_new_tokens": 8, "n": 2, "seed": 5}
    outs = generate(default_server, {"text": "And God said", "sampling_params": params})
    assert [o["index"] for o in outs] == [0, 1]
    assert outs[0]["output_ids"] != outs[1]["output_ids"]


def test_sampling_seed_is_the_seed_by_sglangs_name(default_server: Server) -> None:
    """SGLang's ``sampling_params.sampling_seed`` (it was a 400): the draws of that
    seed; with ``seed`` as well, one value."""
    params = {"max_new_tokens": 8, "temperature": 1.0}
    outs = [
        generate(default_server, {"text": "And God said", "sampling_params": {**params, **p}})
        for p in ({"seed": 11}, {"sampling_seed": 11}, {"sampling_seed": 12}, {"seed": 12})
    ]
    ids = [o["output_ids"] for o in outs]
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2]
    both = {"text": "x", "sampling_params": {"sampling_seed": 1, "seed": 2}}
    refused = httpx.post(f"{default_server.url}/generate", json=both, timeout=60)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "sampling_params.sampling_seed", error
    assert "got 1 and 2" in error["message"], error
    for params in ({"sampling_seed": -1}, [{"sampling_seed": 2**63}]):  # (named seed)
        body = {"text": ["x"] if isinstance(params, list) else "x", "sampling_params": params}
        refused = httpx.post(f"{default_server.url}/generate", json=body, timeout=60)
        error = refused.json()["error"]
        where = "sampling_params[0]" if isinstance(params, list) else "sampling_params"
        assert error["param"] == f"{where}.sampling_seed", error
        assert error["message"].startswith(f"{where}.sampling_seed: expected an integer"), error


def test_stream(default_server: Server) -> None:
    whole = generate(default_server, {"text": "And God said", "sampling_params": GREEDY})
    streamed = events(
        default_server, {"text": "And God said", "sampling_params": GREEDY, "stream": True}
    )
    texts = [e["text"] for e in streamed]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))  # cumulative
    assert texts[-1] == whole["text"]
    assert streamed[-1]["output_ids"] == whole["output_ids"]
    assert streamed[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 16}
    assert all(e["meta_info"]["finish_reason"] is None for e in streamed[:-1])


def test_batch_stream_carries_each_index(default_server: Server) -> None:
    body = {"text": ["And God said", "In the"], "sampling_params": GREEDY, "stream": True}
    streamed = events(default_server, body)
    finals = {e["index"]: e for e in streamed if e["meta_info"]["finish_reason"]}
    assert sorted(finals) == [0, 1]
    whole = generate(
        default_server, {"text": ["And God said", "In the"], "sampling_params": GREEDY}
    )
    assert [finals[i]["text"] for i in (0, 1)] == [o["text"] for o in whole]


def test_logprobs(default_server: Server) -> None:
    out = generate(
        default_server,
        {
            "text": "And God said",
            "sampling_params": {"max_new_tokens": 4, "temperature": 0.0},
            "return_logprob": True,
            "top_logprobs_num": 3,
            "return_text_in_logprobs": True,
        },
    )
    chosen = out["meta_info"]["output_token_logprobs"]
    top = out["meta_info"]["output_top_logprobs"]
    assert [t[1] for t in chosen] == out["output_ids"]
    assert "".join(t[2] for t in chosen) == out["text"]
    assert all(len(t) == 3 for t in top)
    assert [t[0][1] for t in top] == out["output_ids"]  # greedy: each chosen token is the best


def test_prompt_logprobs_from_logprob_start_len(default_server: Server) -> None:
    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    ids = tokenizer.encode("And God said, Let there be light").ids
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 2, "temperature": 0.0},
        "return_logprob": True,
        "top_logprobs_num": 2,
    }
    whole = generate(default_server, {**body, "logprob_start_len": 0})["meta_info"]
    assert [t[1] for t in whole["input_token_logprobs"]] == ids
    assert whole["input_token_logprobs"][0][0] is None  # nothing comes before the first token
    assert all(t[0] <= 0 for t in whole["input_token_logprobs"][1:])
    assert whole["input_top_logprobs"][0] is None
    assert all(len(top) == 2 and top[0][0] >= top[1][0] for top in whole["input_top_logprobs"][1:])
    tail = generate(default_server, {**body, "logprob_start_len": 3})["meta_info"]
    assert tail["input_token_logprobs"] == whole["input_token_logprobs"][3:]
    plain = generate(default_server, body)["meta_info"]  # no start: none, but the keys are
    assert plain["input_token_logprobs"] == [] and plain["input_top_logprobs"] == []  # (SGLang's)


def test_max_new_tokens_0_reads_the_prompt_alone(default_server: Server) -> None:
    """SGLang's prefill-only request (its RuntimeEndpoint caches a prefix and scores
    choices this way; it was a 400): no text, no ids, the prompt's logprobs those
    of a request that generates; streamed too, and over a WebSocket's parse."""
    body = {"text": "And God said, Let there be light", "return_logprob": True}
    full = generate(
        default_server,
        {**body, "logprob_start_len": 0, "sampling_params": {"max_new_tokens": 2}},
    )
    for params in ({"max_new_tokens": 0}, {"max_new_tokens": 0, "stop": "x", "n": 2}):
        out = generate(default_server, {**body, "logprob_start_len": 0, "sampling_params": params})
        for one in out if isinstance(out, list) else [out]:
            meta = one["meta_info"]
            assert (one["text"], one["output_ids"], meta["output_token_logprobs"]) == ("", [], [])
            assert meta["finish_reason"] == {"type": "length", "length": 0}
            assert meta["prompt_tokens"] == full["meta_info"]["prompt_tokens"]
            assert meta["input_token_logprobs"] == full["meta_info"]["input_token_logprobs"]
    streamed = events(
        default_server, {"text": "In the", "sampling_params": {"max_new_tokens": 0}, "stream": True}
    )
    assert streamed[-1]["text"] == "" and streamed[-1]["output_ids"] == []
    assert streamed[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


def test_what_sglangs_clients_send_is_served(default_server: Server) -> None:
    """SGLang's ``sgl.gen`` sends ``regex: null`` among its sampling parameters, its
    bench ``lora_path: null`` and ``stream_options``, others ``image_data: null``,
    ``model``, a ``logprob_start_len`` without ``return_logprob`` (SGLang ignores it
    then), a whole float for an integer: each was a 400. A field that asks for
    something rt lacks still is one."""
    params = {"max_new_tokens": 3.0, "temperature": 0, "regex": None, "json_schema": None}
    params["stop_regex"] = []  # (sgl.gen sends it; each call through RuntimeEndpoint was a 400)
    body = {
        "text": "And God said",
        "sampling_params": params,
        "lora_path": None,
        "image_data": None,
        "return_hidden_states": False,
        "log_metrics": True,
        "model": "default",
        "logprob_start_len": 0,
        "stream_options": {"include_usage": True},
    }
    out = generate(default_server, body)
    assert len(out["output_ids"]) == 3 and "input_token_logprobs" not in out["meta_info"]
    put = httpx.put(f"{default_server.url}/generate", json=body, timeout=60)  # SGLang takes PUT
    assert put.status_code == 200 and put.json()["output_ids"] == out["output_ids"]
    for extra, field in (
        ({"lora_path": "adapter"}, "lora_path: unknown field"),
        ({"sampling_params": {**params, "regex": "a+"}}, "sampling_params.regex: unknown field"),
        ({"model": "other"}, "the model 'other' does not exist"),
    ):
        response = httpx.post(f"{default_server.url}/generate", json={**body, **extra}, timeout=60)
        assert response.status_code in (400, 404) and field in response.text, response.text


async def test_greedy_output_equals_open_engines(default_server: Server) -> None:
    prompts = ["And God said", "In the beginning God created", "Blessed are"]
    served = [
        generate(default_server, {"text": p, "sampling_params": {**GREEDY, "max_new_tokens": 24}})
        for p in prompts
    ]
    async with rt.open_engine() as engine:
        for prompt, out in zip(prompts, served, strict=True):
            direct = await engine.generate(prompt, max_new_tokens=24, temperature=0.0)
            assert list(direct.output_ids) == out["output_ids"]
            assert direct.text == out["text"]

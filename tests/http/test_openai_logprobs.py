"""What OpenAI's logprobs formats promise a client that reads them closely:
``text_offset`` places each token in the choice's text, streamed or not;
``bytes`` are the token's own bytes; and fields the spec types "or null"
take a null. Against rt-serve on the default model."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from serverlib import Server
from tokenizers import Tokenizer

from rt.assets import default_model_path

PROMPT = "In the beginning God created"


@pytest.fixture(scope="module")
def http(default_server: Server) -> Any:
    with httpx.Client(base_url=default_server.url, timeout=60) as client:
        yield client


def streamed(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with http.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [httpx.Response(200, content=d).json() for d in data[:-1]]


def assert_offsets_place_tokens(text: str, logprobs: dict[str, Any], specials: set[str]) -> None:
    offsets = logprobs["text_offset"]
    assert offsets == sorted(offsets) and len(offsets) == len(logprobs["tokens"])
    for token, at in zip(logprobs["tokens"], offsets, strict=True):
        if token not in specials:
            assert text[at : at + len(token)] == token, (token, at, text)


def test_streamed_text_offsets_are_the_whole_answers_while_a_stop_string_holds_text_back(
    http: httpx.Client,
) -> None:
    base = {"prompt": PROMPT, "max_tokens": 14, "temperature": 0, "logprobs": 1}
    text = http.post("/v1/completions", json=base).json()["choices"][0]["text"]
    # a stop string that matches the answer's first words, then fails: the
    # detokenizer holds those words back until it knows
    words = text.split()
    stop = " ".join(words[:3]) + "\x00"
    assert stop[:-1] in text
    for body in ({**base, "stop": [stop]}, {**base, "stop": [stop], "echo": True}):
        whole = http.post("/v1/completions", json=body).json()["choices"][0]
        chunks = [e["choices"][0] for e in streamed(http, "/v1/completions", body) if e["choices"]]
        logprobs = [c["logprobs"] for c in chunks if c["logprobs"]]
        assert "".join(c["text"] for c in chunks) == whole["text"]
        assert [t for lp in logprobs for t in lp["tokens"]] == whole["logprobs"]["tokens"]
        assert [o for lp in logprobs for o in lp["text_offset"]] == whole["logprobs"]["text_offset"]
        assert_offsets_place_tokens(whole["text"], whole["logprobs"], {"<|bos|>"})


def test_echoed_offsets_leave_out_the_bos_the_prompts_text_does_not_hold(
    http: httpx.Client,
) -> None:
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 0, "echo": True}
    choice = http.post("/v1/completions", json=body).json()["choices"][0]
    logprobs = choice["logprobs"]
    assert logprobs["tokens"][0] == "<|bos|>" and logprobs["text_offset"][:2] == [0, 0]
    assert_offsets_place_tokens(choice["text"], logprobs, {"<|bos|>"})
    assert logprobs["text_offset"][-4] >= len(PROMPT)  # the answer's first token, after the prompt


def test_chat_bytes_are_a_tokens_own_bytes_even_for_part_of_a_character(
    http: httpx.Client,
) -> None:
    vocab = Tokenizer.from_file(str(default_model_path() / "tokenizer.json")).get_vocab()
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "logit_bias": {str(vocab["Ã"]): 100},  # GPT-2's character for the byte 0xC3
    }
    token = http.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"][
        "content"
    ][0]
    assert token["token"] == "\ufffd" and token["bytes"] == [0xC3]  # not U+FFFD's EF BF BD
    plain = {**body, "max_tokens": 8}
    del plain["logit_bias"]
    out = http.post("/v1/chat/completions", json=plain).json()["choices"][0]
    joined = bytes(b for t in out["logprobs"]["content"] for b in t["bytes"])
    assert joined.decode() == out["message"]["content"]
    assert all(t["top_logprobs"][0]["bytes"] == t["bytes"] for t in out["logprobs"]["content"])


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "Hi", "stream": None, "echo": None, "logprobs": None}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "stream": None, "logprobs": None},
        ),
        ("/generate", {"text": "Hi", "stream": None, "return_logprob": None}),
    ],
)
def test_a_null_flag_is_the_flag_not_given(http: httpx.Client, path: str, body: Any) -> None:
    response = http.post(path, json=body)  # (a 400 once: "input should be a valid boolean")
    assert response.status_code == 200, response.text
    out = response.json()
    if path == "/generate":
        assert "output_token_logprobs" not in out["meta_info"]
    else:
        assert out["choices"][0]["logprobs"] is None


def test_chat_text_parts_are_the_messages_text(http: httpx.Client) -> None:
    def answer(content: Any) -> str:
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 6}
        response = http.post("/v1/chat/completions", json={**body, "temperature": 0})
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["message"]["content"])

    parts = [{"type": "text", "text": "And God"}, {"type": "text", "text": "said"}]
    assert answer(parts) == answer("And God\nsaid")
    refused = http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
    )
    assert refused.status_code == 400
    assert "messages[0].content[0]: expected a text part" in refused.json()["error"]["message"]


def test_top_logprobs_hold_each_tokens_own_logprob_as_openai_promises(
    http: httpx.Client,
) -> None:
    """OpenAI: "the API will always return the logprob of the sampled token, so
    there may be up to logprobs+1 elements"; with ``logprobs=0``, that one alone."""
    base = {"prompt": PROMPT, "max_tokens": 12, "temperature": 1.5, "seed": 3}
    sizes = {}
    for n in (0, 1):
        logprobs = http.post("/v1/completions", json={**base, "logprobs": n}).json()["choices"][0][
            "logprobs"
        ]
        for token, value, top in zip(
            logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
        ):
            assert top[token] == pytest.approx(value)
        sizes[n] = [len(top) for top in logprobs["top_logprobs"]]
    assert set(sizes[0]) == {1}
    # drawn at temperature 1.5, some token is not the model's best: then its best is there too
    assert set(sizes[1]) == {1, 2}
    echoed = http.post(
        "/v1/completions", json={**base, "max_tokens": 1, "logprobs": 0, "echo": True}
    ).json()["choices"][0]["logprobs"]
    assert echoed["top_logprobs"][0] is None
    for token, value, top in zip(
        echoed["tokens"][1:], echoed["token_logprobs"][1:], echoed["top_logprobs"][1:], strict=True
    ):
        assert top == {token: pytest.approx(value)}


def test_offsets_place_the_pieces_of_a_character_where_the_character_starts(
    http: httpx.Client,
) -> None:
    """A byte-level vocabulary splits "😀" into byte tokens, each of which reads
    as U+FFFD alone: each starts where the character does, and the character
    counts once (each piece used to count as a character of its own)."""
    prompt = "a😀b dear"
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 0, "echo": True}
    choice = http.post("/v1/completions", json=body).json()["choices"][0]
    text, logprobs = choice["text"], choice["logprobs"]
    assert text.startswith(prompt)
    tokens, offsets = logprobs["tokens"], logprobs["text_offset"]
    pieces = [at for token, at in zip(tokens, offsets, strict=True) if "\ufffd" in token]
    assert len(pieces) >= 2 and set(pieces) == {text.index("😀")}
    assert offsets[tokens.index("b", 1)] == text.index("b")
    whole = [k for k, token in enumerate(tokens) if "\ufffd" not in token]
    assert_offsets_place_tokens(
        text,
        {"tokens": [tokens[k] for k in whole], "text_offset": [offsets[k] for k in whole]},
        {"<|bos|>"},
    )
    chunks = [e["choices"][0] for e in streamed(http, "/v1/completions", body) if e["choices"]]
    assert [o for c in chunks if c["logprobs"] for o in c["logprobs"]["text_offset"]] == offsets


def test_a_shown_special_token_is_its_own_text_and_the_offsets_place_it(
    http: httpx.Client,
) -> None:
    """With ``skip_special_tokens: false`` a special token shows as its own text,
    with no space set beside it: a fast tokenizer's decode, as vLLM's and SGLang's
    (rt set it apart by spaces, as slow tokenizers did with
    ``spaces_between_special_tokens``: ' Hello <|end|>'). Every offset points at
    its token, streamed or not, with echo or not, a stop string holding text back
    or not."""
    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    user = tokenizer.token_to_id("<|user|>")
    base = {
        "prompt": "And God said",
        "max_tokens": 10,
        "temperature": 0,
        "logprobs": 0,
        "logit_bias": {str(user): 9},
        "skip_special_tokens": False,
        "ignore_eos": True,
    }
    # a stop string holds text back in a stream: the offsets past it follow the same rule
    held = {**base, "stop": ["\n\n"]}
    for body in (base, {**base, "echo": True}, held, {**held, "echo": True}):
        whole = http.post("/v1/completions", json=body).json()["choices"][0]
        assert "<|user|>" in whole["text"]
        assert_offsets_place_tokens(whole["text"], whole["logprobs"], {"<|bos|>"})
        chunks = [e["choices"][0] for e in streamed(http, "/v1/completions", body) if e["choices"]]
        offsets = [o for c in chunks if c["logprobs"] for o in c["logprobs"]["text_offset"]]
        assert offsets == whole["logprobs"]["text_offset"]
    # after a prompt that ends in a special token too (its text began with a space)
    after = {**base, "prompt": "And God said<|system|>", "logit_bias": {}}
    for body in (base, after):
        whole = http.post("/v1/completions", json={**body, "return_token_ids": True}).json()
        choice = whole["choices"][0]
        assert choice["text"] == tokenizer.decode(choice["token_ids"], skip_special_tokens=False)
    for body in (after, {**after, "echo": True}):
        whole = http.post("/v1/completions", json=body).json()["choices"][0]
        assert_offsets_place_tokens(whole["text"], whole["logprobs"], {"<|bos|>"})


def test_return_tokens_as_token_ids_names_each_token_by_its_id(http: httpx.Client) -> None:
    """vLLM's ``return_tokens_as_token_ids`` (it was an unknown field): the same
    answer, each token named ``token_id:N`` where N is the id the text came from."""
    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    base = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 2, "echo": True}
    named = http.post("/v1/completions", json=base).json()["choices"][0]
    body = {**base, "return_tokens_as_token_ids": True}
    for choice in (
        http.post("/v1/completions", json=body).json()["choices"][0],
        {"text": "", "logprobs": _joined(streamed(http, "/v1/completions", body))},
    ):
        logprobs = choice["logprobs"]
        ids = [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]
        assert len(ids) == len(
            named["logprobs"]["tokens"]
        )  # the prompt's (echo), then the answer's
        assert tokenizer.decode(ids, skip_special_tokens=True) == named["text"]
        assert logprobs["text_offset"] == named["logprobs"]["text_offset"]
        for top in logprobs["top_logprobs"][1:]:
            assert len(top) >= 2 and all(k.startswith("token_id:") for k in top)
    chat = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "return_tokens_as_token_ids": True,
    }
    choice = http.post("/v1/chat/completions", json=chat).json()["choices"][0]
    content = choice["logprobs"]["content"]
    ids = [int(c["token"].removeprefix("token_id:")) for c in content]
    assert tokenizer.decode(ids, skip_special_tokens=True) == choice["message"]["content"]
    assert all(t["token"].startswith("token_id:") for c in content for t in c["top_logprobs"])


def _joined(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream's logprobs, as one."""
    out: dict[str, list[Any]] = {"tokens": [], "top_logprobs": [], "text_offset": []}
    for event in events:
        for choice in event["choices"]:
            for key in out:
                out[key] += choice["logprobs"][key]
    return out


def test_add_special_tokens_puts_the_bos_before_a_prompt_or_leaves_it_out(
    http: httpx.Client,
) -> None:
    """vLLM's per-request ``add_special_tokens`` (it was an unknown field): yes by
    default for completions, no for chat, whose template writes its own."""
    base = {"prompt": PROMPT, "max_tokens": 1, "logprobs": 0, "echo": True}
    usual = http.post("/v1/completions", json=base).json()
    bare = http.post("/v1/completions", json={**base, "add_special_tokens": False}).json()
    assert usual["choices"][0]["logprobs"]["tokens"][0] == "<|bos|>"
    assert bare["choices"][0]["logprobs"]["tokens"][0] != "<|bos|>"
    assert bare["usage"]["prompt_tokens"] == usual["usage"]["prompt_tokens"] - 1
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1}
    plain = http.post("/v1/chat/completions", json=chat).json()["usage"]["prompt_tokens"]
    with_bos = http.post("/v1/chat/completions", json={**chat, "add_special_tokens": True})
    assert with_bos.json()["usage"]["prompt_tokens"] == plain + 1
    refused = http.post("/v1/completions", json={**base, "add_special_tokens": "no"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "add_special_tokens"

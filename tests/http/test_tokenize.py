"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's and SGLang's) against the
shared rt-serve: the ids are the ones the engine gives the same text."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from serverlib import Server


def post(server: Server, path: str, body: Any) -> httpx.Response:
    if isinstance(body, bytes):  # as written (JSON's escapes can carry a lone surrogate)
        return httpx.post(f"{server.url}{path}", content=body, timeout=60)
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def engine_ids(server: Server, text: str) -> list[int]:
    """The prompt's ids as the engine tokenized them (its prompt logprobs name them)."""
    body = {
        "text": text,
        "sampling_params": {"max_new_tokens": 1},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    out = post(server, "/generate", body).json()
    return [entry[1] for entry in out["meta_info"]["input_token_logprobs"]]


def test_tokenize_gives_the_engines_ids_and_detokenize_inverts_it(default_server: Server) -> None:
    text = "And God said, let there be light: and there was light."
    out = post(default_server, "/tokenize", {"prompt": text}).json()
    assert out["tokens"] == engine_ids(default_server, text)
    assert out["count"] == len(out["tokens"])
    assert out["max_model_len"] == 512  # the default model's context
    # SGLang's name for the field, without the special tokens, with the tokens' strings
    bare = post(
        default_server,
        "/tokenize",
        {"text": text, "add_special_tokens": False, "return_token_strs": True},
    ).json()
    assert bare["tokens"] == out["tokens"][1:]  # the default model's tokenizer adds a BOS
    assert bare["token_strs"][:2] == ["And", "ĠGod"]
    back = post(default_server, "/detokenize", {"tokens": bare["tokens"]}).json()
    assert back == {"prompt": text, "text": text}  # vLLM's name and SGLang's
    with_bos = post(default_server, "/detokenize", {"tokens": out["tokens"]}).json()
    assert with_bos["prompt"] == "<|bos|>" + text  # special tokens are kept (vLLM's way)
    skip = {"tokens": out["tokens"], "skip_special_tokens": True}  # SGLang's option
    assert post(default_server, "/detokenize", skip).json()["text"] == text
    # SGLang's /v1/ paths (its documented ones) are the same endpoints
    assert post(default_server, "/v1/tokenize", {"prompt": text}).json() == out
    assert post(default_server, "/v1/detokenize", {"tokens": bare["tokens"]}).json() == back


def test_a_list_of_texts_gives_a_list(default_server: Server) -> None:
    out = post(default_server, "/tokenize", {"prompt": ["one", "two words"]}).json()
    assert out["count"] == [len(ids) for ids in out["tokens"]] and len(out["tokens"]) == 2
    back = post(default_server, "/detokenize", {"tokens": out["tokens"]}).json()
    assert back["text"] == ["<|bos|>one", "<|bos|>two words"]


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/tokenize", {"messages": [{"role": "user", "content": "hi"}]}, 400, "messages: "),
        ("/tokenize", {"prompt": "a", "text": "b"}, 400, "one of prompt or text, got both"),
        ("/tokenize", {}, 400, "one of prompt or text, got neither"),
        ("/tokenize", {"prompt": []}, 400, "prompt: expected a text or a list of texts"),
        ("/tokenize", {"text": []}, 400, "text: expected a text or a list of texts"),
        (
            "/tokenize",
            rb'{"prompt": ["fine", "\ud800"]}',
            400,
            "prompt[1]: the text is not valid Unicode: a lone surrogate",
        ),
        ("/tokenize", {"prompt": 5}, 400, "prompt: "),
        ("/tokenize", {"prompt": "a", "add_special": True}, 400, "add_special: unknown field"),
        ("/tokenize", {"prompt": "a", "model": "other"}, 404, "'other' does not exist"),
        # (a tokenizer holds ~250 bytes a token: 16 MiB of text took 4 GiB of the server)
        ("/tokenize", {"text": ["ab" * (1 << 19), "c"]}, 413, "text: at most 1048576 bytes"),
        ("/tokenize", {"prompt": "\U0001f600" * 300_000}, 413, "prompt: at most 1048576 bytes"),
        ("/tokenize", {"prompt": [""] * 1100}, 413, "each text counting 1024 more; got 1100"),
        ("/detokenize", {"tokens": [1, 99999]}, 400, "tokens: expected token ids in [0, 4096)"),
        ("/detokenize", {"tokens": [[1] * (1 << 20), [2]]}, 413, "at most 1048576 token ids"),
        ("/detokenize", {"tokens": [[1], [-1]]}, 400, "tokens[1]: expected token ids"),
        ("/detokenize", {"tokens": "1 2"}, 400, "tokens: "),
        ("/detokenize", {}, 400, "tokens: this field is required"),
    ],
)
def test_bad_bodies_are_refused_saying_why(
    default_server: Server, path: str, body: Any, status: int, says: str
) -> None:
    out = post(default_server, path, body)
    assert out.status_code == status, out.text
    assert says in out.json()["error"]["message"]

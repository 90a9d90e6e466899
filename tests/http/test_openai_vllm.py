"""vLLM's extensions of the OpenAI API (stop_reason, return_token_ids,
allowed_token_ids, request_id), through the official ``openai`` client, against
rt-serve on the default model."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from serverlib import model_id

MESSAGES = [{"role": "user", "content": "And God said"}]


def test_stop_reason_names_the_stop_that_ended_a_choice(client: openai.OpenAI) -> None:
    """vLLM's ``stop_reason`` beside SGLang's ``matched_stop``: the stop string or
    the stop token id; None at the length (or EOS). Streamed on the last chunk."""
    kwargs: Any = {"model": model_id(client), "prompt": "And God said", "temperature": 0}
    whole = client.completions.create(**kwargs, max_tokens=12)
    assert whole.choices[0].finish_reason == "length"
    assert whole.choices[0].stop_reason is None  # type: ignore[attr-defined]
    stop = whole.choices[0].text.split()[2]
    by_text = client.completions.create(**kwargs, max_tokens=12, stop=[stop])
    assert by_text.choices[0].stop_reason == stop  # type: ignore[attr-defined]
    ids = client.completions.create(
        **kwargs, max_tokens=12, logprobs=0, extra_body={"return_tokens_as_token_ids": True}
    )
    token = int(ids.choices[0].logprobs.tokens[3].split(":")[1])  # type: ignore[union-attr]
    extra = {"stop_token_ids": [token]}
    by_id = client.completions.create(**kwargs, max_tokens=12, extra_body=extra)
    assert by_id.choices[0].stop_reason == token  # type: ignore[attr-defined]
    last = list(client.completions.create(**kwargs, max_tokens=12, extra_body=extra, stream=True))
    assert last[-1].choices[0].stop_reason == token  # type: ignore[attr-defined]
    # the end of text (the model's EOS, 1) is no stop_reason, among the stop ids too
    eos: Any = {"logit_bias": {"1": 100}, "stop_token_ids": [1]}
    at_eos = client.completions.create(**kwargs, max_tokens=4, extra_body=eos).choices[0]
    assert at_eos.finish_reason == "stop" and at_eos.stop_reason is None  # type: ignore[attr-defined]
    assert at_eos.matched_stop == 1  # type: ignore[attr-defined]  # (SGLang's names it)
    chat_kwargs: Any = {"model": model_id(client), "messages": MESSAGES, "temperature": 0}
    said = client.chat.completions.create(**chat_kwargs, max_tokens=12).choices[0].message.content
    word = (said or "").split()[1]
    chat = client.chat.completions.create(**chat_kwargs, max_tokens=12, stop=[word])
    assert chat.choices[0].stop_reason == word  # type: ignore[attr-defined]


def test_return_token_ids_gives_the_prompts_and_each_choices_ids(client: openai.OpenAI) -> None:
    """vLLM's ``return_token_ids`` (RL and agent frameworks read it; it was a 400):
    each choice's ``token_ids`` and the prompt's ``prompt_token_ids`` as the model
    read them; a stream sends each chunk's new ids and the prompt's in its first."""
    model, ids = model_id(client), [5, 6, 7, 8, 9]
    kwargs: Any = {"model": model, "max_tokens": 6, "temperature": 0}
    kwargs["extra_body"] = {"return_token_ids": True, "ignore_eos": True}
    whole = client.completions.create(prompt=ids, **kwargs).model_dump()
    (choice,) = whole["choices"]
    assert choice["prompt_token_ids"] == ids and len(choice["token_ids"]) == 6
    chunks = [c.model_dump() for c in client.completions.create(prompt=ids, stream=True, **kwargs)]
    streamed = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert streamed == choice["token_ids"]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == ids
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])

    chat = client.chat.completions.create(messages=MESSAGES, **kwargs).model_dump()
    assert len(chat["prompt_token_ids"]) == chat["usage"]["prompt_tokens"]
    assert len(chat["choices"][0]["token_ids"]) == 6
    stream = client.chat.completions.create(messages=MESSAGES, stream=True, **kwargs)
    chunks = [c.model_dump() for c in stream]
    assert chunks[0]["prompt_token_ids"] == chat["prompt_token_ids"]
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == chat["choices"][0][
        "token_ids"
    ]
    plain = client.completions.create(prompt=ids, model=model, max_tokens=1).model_dump()
    assert "token_ids" not in plain["choices"][0]  # (not asked: not there)


def test_allowed_token_ids_are_the_only_ids_drawn(client: openai.OpenAI) -> None:
    """vLLM's ``allowed_token_ids`` (it was a 400): sampled or greedy, on both
    endpoints, streamed too; an empty list or an id past the vocabulary is a 400
    that names the field."""
    model, allowed = model_id(client), [40, 41, 300, 301]
    kwargs: Any = {"model": model, "max_tokens": 8, "seed": 4}
    kwargs["extra_body"] = {"allowed_token_ids": allowed, "return_token_ids": True}
    text = client.completions.create(prompt="Once upon", temperature=1.5, **kwargs).model_dump()
    assert set(text["choices"][0]["token_ids"]) <= set(allowed)
    chat = client.chat.completions.create(messages=MESSAGES, temperature=0, **kwargs)
    assert set(chat.model_dump()["choices"][0]["token_ids"]) <= set(allowed)
    stream = client.chat.completions.create(messages=MESSAGES, stream=True, **kwargs)
    streamed = [t for c in stream for t in c.model_dump()["choices"][0]["token_ids"]]
    assert streamed and set(streamed) <= set(allowed)
    for bad, says in (([], "at least one token id"), ([5, 10**6], "token ids in [0, ")):
        with pytest.raises(openai.BadRequestError, match="allowed_token_ids") as err:
            client.completions.create(
                model=model, prompt="x", max_tokens=2, extra_body={"allowed_token_ids": bad}
            )
        assert says in str(err.value)


def test_request_id_is_the_rid_by_vllms_name(client: openai.OpenAI) -> None:
    model = model_id(client)
    out = client.completions.create(
        model=model, prompt="x", max_tokens=1, extra_body={"request_id": "mine"}
    )
    assert out.id == "cmpl-mine"
    same = {"request_id": "mine2", "rid": "mine2"}
    chat = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=1, extra_body=same
    )
    assert chat.id == "chatcmpl-mine2"
    with pytest.raises(openai.BadRequestError, match="request_id and rid") as err:
        client.completions.create(
            model=model, prompt="x", max_tokens=1, extra_body={"request_id": "a", "rid": "b"}
        )
    assert err.value.param == "request_id"
    empty = {"request_id": "mine3", "rid": ""}  # ("" is no rid, as everywhere)
    assert client.completions.create(model=model, prompt="x", max_tokens=1, extra_body=empty).id
    # its errors name the field the client sent (they named rid)
    long: Any = {"request_id": "r" * 1025}
    for prompt, said in (("x", "at most 1024"), (["x", "y"], "at most 1022")):
        with pytest.raises(openai.BadRequestError, match=f"^.*request_id: expected {said}") as err:
            client.completions.create(model=model, prompt=prompt, max_tokens=1, extra_body=long)
        assert err.value.param == "request_id"
    with pytest.raises(openai.BadRequestError, match="request_id: expected at most 1024") as err:
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=1, extra_body=long
        )
    assert err.value.param == "request_id"

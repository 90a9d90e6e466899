"""The OpenAI API through the official ``openai`` client, against rt-serve on
the default model."""

from __future__ import annotations

import re
from typing import Any

import httpx
import openai
import pytest
from serverlib import model_id

MESSAGES = [{"role": "user", "content": "And God said"}]


def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert len(models) == 1
    card = models[0].model_dump()
    assert card["max_model_len"] == 512
    assert card["root"].endswith("default_model")
    assert client.models.retrieve(card["id"]).id == card["id"]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("no-such-model")
    empty = httpx.get(f"{str(client.base_url).rstrip('/')}/models/")  # (the card was served)
    assert empty.status_code == 404 and "expected a model id" in empty.text, empty.text
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)


def test_chat_completion(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=model_id(client), messages=MESSAGES, max_tokens=8, temperature=0.0
    )
    assert out.object == "chat.completion"
    choice = out.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("length", "stop")
    assert out.usage is not None
    assert out.usage.prompt_tokens > 0
    assert 0 < out.usage.completion_tokens <= 8
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    # the newer name of the system role, which the shipped model's template does not know
    dev = client.chat.completions.create(
        model=model_id(client),
        messages=[{"role": "developer", "content": "Answer briefly."}, *MESSAGES],
        max_tokens=8,
        temperature=0.0,
    )
    system = client.chat.completions.create(
        model=model_id(client),
        messages=[{"role": "system", "content": "Answer briefly."}, *MESSAGES],
        max_tokens=8,
        temperature=0.0,
    )
    assert dev.choices[0].message.content == system.choices[0].message.content
    assert dev.usage is not None and system.usage is not None
    assert dev.usage.prompt_tokens == system.usage.prompt_tokens


def test_chat_stream_with_usage_in_the_last_chunk(client: openai.OpenAI) -> None:
    kwargs = {"model": model_id(client), "messages": MESSAGES, "max_tokens": 12, "seed": 3}
    # (seed 3's reply is 12 tokens here; on another device 3 % of draws end before)
    kwargs["extra_body"] = {"ignore_eos": True}
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )  # type: ignore[call-overload]
    )
    # the first chunk is the role alone (OpenAI's and vLLM's), the others no role
    assert (chunks[0].choices[0].delta.role, chunks[0].choices[0].delta.content) == (
        "assistant",
        "",
    )
    assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content  # the same seed: the same sample
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 12
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens  # type: ignore[union-attr]


def test_chat_n2_draws_each_sample_from_its_own_seed(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=model_id(client), messages=MESSAGES, max_tokens=16, n=2, seed=11, temperature=1.0
    )
    assert [c.index for c in out.choices] == [0, 1]
    assert out.choices[0].message.content != out.choices[1].message.content
    again = client.chat.completions.create(
        model=model_id(client), messages=MESSAGES, max_tokens=16, n=2, seed=11, temperature=1.0
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in out.choices]


def test_chat_logprobs(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=model_id(client),
        messages=MESSAGES,
        max_tokens=4,
        temperature=0.0,
        logprobs=True,
        top_logprobs=2,
    )
    content = out.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 4
    assert "".join(t.token for t in content) == out.choices[0].message.content
    for token in content:
        assert len(token.top_logprobs) == 2
        assert token.logprob == pytest.approx(token.top_logprobs[0].logprob)  # greedy: the best


def test_completion_stop_and_echo(client: openai.OpenAI) -> None:
    base = client.completions.create(
        model=model_id(client), prompt="And God said", max_tokens=16, temperature=0.0
    )
    text = base.choices[0].text
    stop = text.split()[2]  # a word from the middle of the greedy text
    out = client.completions.create(
        model=model_id(client), prompt="And God said", max_tokens=16, temperature=0.0, stop=stop
    )
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].text == text[: text.index(stop)]
    for name in ("include_stop_str_in_output", "no_stop_trim"):  # vLLM's, SGLang's
        kept = client.completions.create(
            model=model_id(client),
            prompt="And God said",
            max_tokens=16,
            temperature=0.0,
            stop=stop,
            stream=True,
            extra_body={name: True},
        )
        assert "".join(c.choices[0].text for c in kept) == text[: text.index(stop) + len(stop)]
    with pytest.raises(openai.BadRequestError, match="include_stop_str_in_output"):
        client.completions.create(
            model=model_id(client),
            prompt="And God said",
            stop=stop,
            extra_body={"include_stop_str_in_output": True, "no_stop_trim": False},
        )
    echoed = client.completions.create(
        model=model_id(client), prompt="And God said", max_tokens=4, temperature=0.0, echo=True
    )
    assert echoed.choices[0].text.startswith("And God said" + text[:3])


def test_completion_list_prompt_n2_is_prompt_major(client: openai.OpenAI) -> None:
    prompts = ["And God said", "In the beginning"]
    out = client.completions.create(
        model=model_id(client), prompt=prompts, max_tokens=4, n=2, temperature=0.0
    )
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    singles = [
        client.completions.create(model=model_id(client), prompt=p, max_tokens=4, temperature=0.0)
        for p in prompts
    ]
    texts = [c.text for c in out.choices]
    assert texts == [singles[0].choices[0].text] * 2 + [singles[1].choices[0].text] * 2
    assert out.usage is not None
    assert out.usage.completion_tokens == 16


def test_completion_stream_and_logprobs(client: openai.OpenAI) -> None:
    kwargs = {"model": model_id(client), "prompt": "In the beginning", "max_tokens": 6}
    whole = client.completions.create(**kwargs, temperature=0.0, logprobs=1)  # type: ignore[call-overload]
    chunks = list(
        client.completions.create(**kwargs, temperature=0.0, logprobs=1, stream=True)  # type: ignore[call-overload]
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and len(logprobs.tokens or []) == 6
    streamed = [lp for c in chunks for lp in (c.choices[0].logprobs.token_logprobs or [])]  # type: ignore[union-attr]
    assert streamed == pytest.approx(logprobs.token_logprobs)


def test_completion_echo_with_logprobs_covers_the_prompt(client: openai.OpenAI) -> None:
    kwargs = {"model": model_id(client), "prompt": "In the beginning", "max_tokens": 3}
    plain = client.completions.create(**kwargs, temperature=0.0, logprobs=2)  # type: ignore[call-overload]
    out = client.completions.create(**kwargs, temperature=0.0, logprobs=2, echo=True)  # type: ignore[call-overload]
    logprobs = out.choices[0].logprobs
    assert logprobs is not None and plain.choices[0].logprobs is not None
    tokens, values = logprobs.tokens or [], logprobs.token_logprobs or []
    produced = plain.choices[0].logprobs.tokens or []
    prompt_len = len(tokens) - len(produced)
    assert prompt_len >= 3 and tokens[prompt_len:] == produced
    assert "".join(tokens[:prompt_len]).endswith("In the beginning")  # after a BOS, if any
    assert values[0] is None and all(v <= 0 for v in values[1:])
    assert values[prompt_len:] == pytest.approx(plain.choices[0].logprobs.token_logprobs, abs=1e-4)
    tops = logprobs.top_logprobs or []
    assert tops[0] is None and all(2 <= len(t) <= 3 for t in tops[1:])  # its own, and the best 2
    assert all(tops[k][tokens[k]] == pytest.approx(values[k]) for k in range(1, len(tokens)))
    assert out.choices[0].text == "In the beginning" + plain.choices[0].text
    chunks = list(
        client.completions.create(**kwargs, temperature=0.0, logprobs=2, echo=True, stream=True)  # type: ignore[call-overload]
    )
    streamed = [lp for c in chunks for lp in (c.choices[0].logprobs.token_logprobs or [])]  # type: ignore[union-attr]
    assert streamed[0] is None and streamed[1:] == pytest.approx(values[1:], abs=1e-4)


def test_echo_with_max_tokens_0_scores_the_prompt_alone(client: openai.OpenAI) -> None:
    """OpenAI's and vLLM's way to score a prompt: echo it with its logprobs and
    generate nothing (max_tokens 0 without echo is still refused, below)."""
    kwargs = {"model": model_id(client), "prompt": "In the beginning", "logprobs": 1, "echo": True}
    scored = client.completions.create(**kwargs, max_tokens=0)  # type: ignore[call-overload]
    full = client.completions.create(**kwargs, max_tokens=2, temperature=0.0)  # type: ignore[call-overload]
    (choice,) = scored.choices
    assert choice.text == "In the beginning" and choice.finish_reason == "length"
    assert scored.usage is not None and scored.usage.completion_tokens == 0
    assert scored.usage.prompt_tokens == full.usage.prompt_tokens  # type: ignore[union-attr]
    lp, full_lp = choice.logprobs, full.choices[0].logprobs
    assert lp is not None and full_lp is not None
    prompt_len = len(full_lp.tokens or []) - 2
    assert lp.tokens == (full_lp.tokens or [])[:prompt_len]
    assert lp.token_logprobs == pytest.approx((full_lp.token_logprobs or [])[:prompt_len], abs=1e-4)
    chunks = list(client.completions.create(**kwargs, max_tokens=0, stream=True))  # type: ignore[call-overload]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "In the beginning"
    streamed = [t for c in chunks if c.choices for t in (c.choices[0].logprobs.tokens or [])]  # type: ignore[union-attr]
    assert streamed == lp.tokens
    # the token drawn and dropped ends nothing: every id a stop, the answer is the same
    every_id = {"stop_token_ids": list(range(4096)), "ignore_eos": False}
    stopped = client.completions.create(**kwargs, max_tokens=0, extra_body=every_id)  # type: ignore[call-overload]
    assert stopped.choices[0].finish_reason == "length"
    assert stopped.choices[0].logprobs.tokens == lp.tokens  # type: ignore[union-attr]
    with pytest.raises(
        openai.BadRequestError, match=r"min_tokens: expected at most max_tokens \(0\), got 2"
    ):
        client.completions.create(**kwargs, max_tokens=0, extra_body={"min_tokens": 2})  # type: ignore[call-overload]


def test_truncate_prompt_tokens_cuts_one_request_on_a_server_that_cuts_none(
    client: openai.OpenAI,
) -> None:
    """vLLM's per-request truncation, where the server has no --allow-auto-truncate:
    k keeps the prompt's last k tokens, -1 cuts a prompt to fit the context."""
    model = model_id(client)
    over = client.completions.create(
        model=model, prompt="word " * 600, max_tokens=4, extra_body={"truncate_prompt_tokens": -1}
    )
    assert over.usage is not None and over.usage.prompt_tokens == 512 - 4
    prompt = "In the beginning God created the heaven and the earth"
    kept = client.completions.create(  # echoes the prompt the model read
        model=model,
        prompt=prompt,
        max_tokens=0,
        echo=True,
        logprobs=0,
        extra_body={"truncate_prompt_tokens": 5},
    )
    assert kept.usage is not None and kept.usage.prompt_tokens == 5
    tokens = kept.choices[0].logprobs.tokens  # type: ignore[union-attr]
    assert tokens is not None and len(tokens) == 5
    assert kept.choices[0].text == "".join(tokens) and prompt.endswith(kept.choices[0].text)
    chat = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=1, extra_body={"truncate_prompt_tokens": 3}
    )
    assert chat.usage is not None and chat.usage.prompt_tokens == 3
    with pytest.raises(openai.BadRequestError, match=r"truncate_prompt_tokens: .* got 0"):
        client.completions.create(
            model=model, prompt="x", max_tokens=1, extra_body={"truncate_prompt_tokens": 0}
        )


def test_bad_requests_raise_bad_request_error(client: openai.OpenAI) -> None:
    model = model_id(client)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=model, messages=MESSAGES, temperature=-1)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=model, prompt="x", max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="--allow-auto-truncate") as err:
        client.completions.create(model=model, prompt="word " * 300, max_tokens=400)
    assert "(or send truncate_prompt_tokens)" in err.value.message
    assert err.value.code == "context_length_exceeded"
    assert "max_tokens is 400" in err.value.message  # the field this endpoint takes
    assert err.value.param == "max_tokens"
    # a prompt over the context on its own: no max_tokens could help, and none is blamed
    with pytest.raises(
        openai.BadRequestError, match="over the context length 512 on its own"
    ) as err:
        client.completions.create(model=model, prompt="word " * 600, max_tokens=4)
    assert err.value.param == "prompt"  # (it was null)
    # echo decodes a token-id prompt before the engine sees it: its ids are checked first
    # (a negative one, or one past 2**64, was a 500 from the decoder)
    for prompt, where, bad in (
        ([-1], "prompt[0]", -1),
        ([[5], [7, 2**64]], "prompt[1][1]", 2**64),
    ):
        with pytest.raises(
            openai.BadRequestError,
            match=rf"{re.escape(where)}: expected a token id in \[0, 4096\), got {bad}",
        ):
            client.completions.create(model=model, prompt=prompt, max_tokens=2, echo=True)
    assert set(err.value.body) == {"message", "type", "param", "code"}  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model=model, messages=[])
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            tools=[{"type": "function", "function": {"name": "f"}}],
        )
    with pytest.raises(openai.BadRequestError, match="unknown field"):
        client.completions.create(model=model, prompt="x", extra_body={"temprature": 0.5})


def test_chat_without_max_tokens_may_fill_the_context(client: openai.OpenAI) -> None:
    """As OpenAI's, vLLM's and SGLang's: no max_tokens is the room the prompt
    leaves in the context, not the engine's default of 128 (which also refused
    a prompt that fit, naming max_tokens, a field the client never sent)."""
    model = model_id(client)
    long = [{"role": "user", "content": " the" * 470}]
    prompt = client.chat.completions.create(model=model, messages=long, max_tokens=1)
    assert prompt.usage is not None and 400 < prompt.usage.prompt_tokens < 512 - 16
    room = 512 - prompt.usage.prompt_tokens
    out = client.chat.completions.create(
        model=model, messages=long, extra_body={"ignore_eos": True}
    )
    assert out.usage is not None and out.usage.completion_tokens == room
    assert out.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="no room for an answer") as err:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": " the" * 600}]
        )
    assert err.value.param == "messages" and err.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="max_completion_tokens is 100"):
        client.chat.completions.create(model=model, messages=long, max_completion_tokens=100)
    with pytest.raises(
        openai.BadRequestError, match=rf"room for {room} new .* min_tokens \(100\)"
    ) as err:
        client.chat.completions.create(model=model, messages=long, extra_body={"min_tokens": 100})
    assert err.value.param == "min_tokens"


def test_small_conventions_of_openai_clients(client: openai.OpenAI) -> None:
    model = model_id(client)
    for name in ("", model):  # an empty model is none given, as vLLM takes it
        out = client.completions.create(
            model=name, prompt="In the", max_tokens=2, extra_body={"min_tokens": 2}
        )  # (min_tokens: no end of text drawn first, which would leave no text)
        assert out.choices[0].text
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content: expected a string"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": None}])  # type: ignore[list-item]
    # the default policy (fcfs) has no priorities: one is refused, not silently ignored
    with pytest.raises(
        openai.BadRequestError, match="priority: the schedule policy is 'fcfs'"
    ) as err:
        client.completions.create(model=model, prompt="x", max_tokens=1, extra_body={"priority": 5})
    assert err.value.param == "priority"
    client.completions.create(model=model, prompt="x", max_tokens=1, extra_body={"priority": 0})


def test_fields_that_ask_for_nothing_rt_lacks_are_accepted(client: openai.OpenAI) -> None:
    """What current OpenAI clients send by default, or to say "none of that":
    an empty tool list, tool_choice "none", text-only modalities, a stream's
    include_obfuscation, and the cache and safety keys. Each is a no-op here and
    must not be a 400; asking for what rt lacks still is."""
    model = model_id(client)
    out = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=2,
        tools=[],
        tool_choice="none",
        modalities=["text"],
        safety_identifier="user-1",
        prompt_cache_key="k",
        prompt_cache_retention="24h",
        prediction={"type": "content", "content": "And"},
        verbosity="low",
        # (min_tokens: no end of text drawn first, which would leave no content)
        extra_body={"audio": None, "web_search_options": None, "min_tokens": 2},
    )
    assert out.choices[0].message.content
    for choice in ("auto", "required"):  # an empty tool list: none to call, as vLLM takes it
        out = client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=2,
            tools=[],
            tool_choice=choice,
            top_logprobs=0,  # (vLLM's default: asks for no logprobs)
            stream_options={},  # (not streaming: an empty one asks nothing)
            extra_body={"min_tokens": 2},
        )
        assert out.choices[0].message.content and out.choices[0].logprobs is None
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True, "include_obfuscation": False},
            extra_body={"min_tokens": 2},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2
    with pytest.raises(openai.BadRequestError, match="modalities: only") as err:
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=2, modalities=["text", "audio"]
        )
    assert err.value.param == "modalities"
    with pytest.raises(openai.BadRequestError, match="tool_choice: not supported"):
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=2, tool_choice="required"
        )
    # tools with none to call are served, without them (as vLLM's
    # --exclude-tools-when-tool-choice-none): agent frameworks send their tools always
    tool: Any = {"type": "function", "function": {"name": "f", "parameters": {}}}
    plain = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=4, temperature=0
    )
    served = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        tools=[tool],
        tool_choice="none",
    )
    assert served.choices[0].message.content == plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="tools: not supported") as err:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, tools=[tool])
    assert err.value.param == "tools"
    for name, value in (("audio", {"voice": "alloy", "format": "wav"}), ("web_search_options", {})):
        with pytest.raises(openai.BadRequestError, match=f"{name}: not supported") as err:
            client.chat.completions.create(
                model=model, messages=MESSAGES, max_tokens=2, extra_body={name: value}
            )
        assert err.value.param == name


@pytest.mark.parametrize("chat", [False, True])
def test_continuous_usage_stats_put_each_choices_usage_so_far_on_every_chunk(
    client: openai.OpenAI, chat: bool
) -> None:
    """vLLM's ``stream_options.continuous_usage_stats`` (it was an unknown field);
    alone, it implies include_usage, as vLLM's default (no usage came at all)."""
    options: Any = {"continuous_usage_stats": True}
    if not chat:
        options["include_usage"] = True
    kwargs: Any = {"model": model_id(client), "max_tokens": 5, "n": 2, "stream": True}
    kwargs["extra_body"] = {"ignore_eos": True}  # (5 tokens each, whatever they are)
    if chat:
        stream = client.chat.completions.create(messages=MESSAGES, stream_options=options, **kwargs)
    else:
        stream = client.completions.create(prompt="And God said", stream_options=options, **kwargs)
    chunks = list(stream)
    *deltas, last = chunks
    assert not last.choices and last.usage is not None and last.usage.completion_tokens == 10
    seen = {0: 0, 1: 0}
    for chunk in deltas:
        (choice,) = chunk.choices
        assert chunk.usage is not None and chunk.usage.prompt_tokens == last.usage.prompt_tokens
        assert chunk.usage.completion_tokens >= seen[choice.index]  # so far, for this choice
        seen[choice.index] = chunk.usage.completion_tokens
        assert chunk.usage.total_tokens == chunk.usage.prompt_tokens + seen[choice.index]
    assert seen == {0: 5, 1: 5}


def test_a_negative_seed_is_a_seed(client: openai.OpenAI) -> None:
    """OpenAI's and vLLM's seed is any 64-bit integer: -1 is one more seed (it was
    a 400), the same draws each time; past 64 bits it is refused by name."""
    model = model_id(client)
    kwargs: Any = {"model": model, "prompt": "And God said", "max_tokens": 12, "temperature": 1.0}
    texts = {
        seed: [client.completions.create(**kwargs, seed=seed).choices[0].text for _ in range(2)]
        for seed in (-1, -(2**63), 7)
    }
    for seed, (a, b) in texts.items():
        assert a == b, seed
    assert len({t[0] for t in texts.values()}) == 3  # three seeds, three draws
    for seed in (-(2**63) - 1, 2**63):  # (the message gave [0, 2^63-1] above)
        with pytest.raises(
            openai.BadRequestError, match=re.escape("seed: expected an integer in [-2^63, 2^63-1]")
        ) as err:
            client.completions.create(**kwargs, seed=seed)
        assert err.value.param == "seed"


def test_the_chat_templates_variables(client: openai.OpenAI) -> None:
    """vLLM's and SGLang's ``chat_template_kwargs`` (Qwen3's ``enable_thinking``),
    ``reasoning_effort``, ``add_generation_prompt`` and ``continue_final_message``:
    the shipped template reads only the last two; the others change nothing and
    are no 400."""
    chat = [*MESSAGES, {"role": "assistant", "content": "Let there"}]

    def prompt_tokens(**extra: Any) -> int:
        out = client.chat.completions.create(
            model=model_id(client), messages=chat, max_tokens=1, extra_body=extra or None
        )
        assert out.usage is not None
        return out.usage.prompt_tokens

    opened = prompt_tokens()  # …Let there<|end|>\n<|assistant|>\n
    assert prompt_tokens(reasoning_effort="high", chat_template_kwargs={"x": 1}) == opened
    closed = prompt_tokens(add_generation_prompt=False)  # …Let there<|end|>\n
    going_on = prompt_tokens(continue_final_message=True)  # …Let there
    assert opened > closed > going_on
    assert prompt_tokens(chat_template_kwargs={"continue_final_message": True}) == going_on
    with pytest.raises(openai.BadRequestError, match="tokenize cannot be set"):
        prompt_tokens(chat_template_kwargs={"tokenize": True})
    with pytest.raises(openai.BadRequestError, match="at most one of them true"):
        prompt_tokens(add_generation_prompt=True, continue_final_message=True)


def test_what_vllm_and_sglang_clients_send_and_ignore_is_served(client: openai.OpenAI) -> None:
    """Fields of vLLM's and SGLang's that rt does not take, at values that ask for
    nothing (null, false, a default), as wrappers send their whole set of
    options; a whole float for an integer (``max_tokens=n / 2``); SGLang's model
    name "default". Each was a 400 or a 404; a value that asks for something
    rt lacks still is a 400 naming the field."""
    kwargs: Any = {"model": "default", "prompt": "And God said", "max_tokens": 3.0}
    body = {
        "use_beam_search": False,
        "length_penalty": 1.0,
        "prompt_logprobs": None,
        "guided_json": None,
        "structured_outputs": None,
        "lora_path": None,
        "response_format": {"type": "text"},
        "ignore_eos": True,
    }
    out = client.completions.create(**kwargs, extra_body=body)
    assert out.usage is not None and out.usage.completion_tokens == 3
    chat = client.chat.completions.create(
        model="default",
        messages=MESSAGES,
        max_tokens=2,
        # (SGLang's reasoning defaults, in its docs' extra_body: each was a 400)
        extra_body={
            "echo": False,
            "regex": None,
            "separate_reasoning": True,
            "stream_reasoning": True,
        },
    )
    assert chat.usage is not None and chat.usage.completion_tokens <= 2
    # ({} asks for something too: vLLM's guided_json {} constrains the answer to JSON)
    for name, value in (("guided_json", {}), ("length_penalty", 0.5)):
        with pytest.raises(openai.BadRequestError, match=f"{name}: unknown field") as err:
            client.completions.create(**kwargs, extra_body={name: value})
        assert err.value.param == name
    with pytest.raises(openai.BadRequestError, match="max_tokens: input should be a valid integer"):
        client.completions.create(**{**kwargs, "max_tokens": 2.5})

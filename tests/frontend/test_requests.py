"""build_request: whatever a caller passes is either a request every actor can
serve or an InvalidRequestError that names the argument, says what was
expected and what arrived, before anything reaches a ring."""

from __future__ import annotations

import math
from collections import UserDict
from types import MappingProxyType
from typing import Any

import msgspec
import numpy as np
import pytest

from rt.config import EngineOptions
from rt.errors import ContextOverflowError, InvalidRequestError
from rt.frontend.chat import MAX_JSON_DEPTH, MAX_JSON_VALUES
from rt.frontend.requests import (
    FLOAT_FIELDS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    build_request,
)
from rt.gpu.sampling_params import FLOAT32_MAX, SEED_MASK
from rt.messages import GenerateRequest

_, VOCAB = EngineOptions().model_limits()  # the default model's vocabulary (4096)
BIG = 10**30  # past 64 bits
HUGE = 10**400  # past what a float can hold
CHAT = [{"role": "user", "content": "hello"}]


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


class Opaque:
    """A value msgspec cannot encode (the codec would have pickled it)."""


REFUSED = [
    # the prompt
    pytest.param("\ud800", {}, r"prompt: .*not valid Unicode.*'\\ud800' at position 0", id="surrogate-text"),
    pytest.param("ab\udfffcd", {}, r"prompt: .*at position 2", id="surrogate-text-position"),
    pytest.param(b"hello", {}, r"prompt: expected text, .* got bytes", id="bytes"),
    pytest.param(5, {}, r"prompt: expected text, .* got 5", id="int-prompt"),
    pytest.param({"role": "user"}, {}, r"prompt: expected .* got dict", id="dict-prompt"),
    pytest.param([], {}, r"prompt: expected .* got an empty list", id="empty-list"),
    pytest.param([1, -1], {}, r"prompt\[1\]: expected a token id in \[0, 4096\), got -1", id="negative-id"),
    pytest.param([VOCAB], {}, r"prompt\[0\]: expected a token id in \[0, 4096\)", id="id-past-vocab"),
    pytest.param([BIG], {}, r"prompt\[0\]: .*an integer of 100 bits", id="huge-id"),
    pytest.param([True], {}, r"prompt\[0\]: expected a token id .* got True", id="bool-id"),
    pytest.param([1, 2.0], {}, r"prompt\[1\]: expected a token id", id="float-id"),
    pytest.param(None, {}, r"expected exactly one of a prompt, input_ids= or messages=", id="no-prompt"),
    pytest.param("hi", {"input_ids": [1]}, r"exactly one of .* \['prompt', 'input_ids'\]", id="two-prompts"),
    pytest.param(None, {"input_ids": "abc"}, r"input_ids: expected a list of token ids, got a string", id="ids-as-string"),
    pytest.param(None, {"input_ids": []}, r"input_ids: expected a list of token ids, got an empty list", id="empty-ids"),
    pytest.param(None, {"input_ids": CHAT}, r"input_ids\[0\]: expected a token id", id="messages-as-ids"),
    # chat messages
    pytest.param(None, {"messages": []}, r"messages: expected a list of chat messages, got an empty list", id="no-messages"),
    pytest.param(None, {"messages": "hi"}, r"messages: expected a list of chat messages, got a string", id="messages-string"),
    pytest.param(None, {"messages": [5]}, r"messages\[0\]: expected a chat message .* got 5", id="message-int"),
    pytest.param(None, {"messages": [CHAT[0], "hi"]}, r"messages\[1\]: expected a chat message", id="message-string"),
    pytest.param(None, {"messages": [{"role": "user"}]}, r"messages\[0\]: expected a 'content' field, got the fields 'role'", id="no-content"),
    pytest.param(None, {"messages": [{"content": "x"}]}, r"messages\[0\]: expected a 'role' field", id="no-role"),
    pytest.param(None, {"messages": [{"role": "user", "content": 5}]}, r"messages\[0\]\.content: expected a string or a list of text parts, got 5", id="content-int"),
    pytest.param(None, {"messages": [{"role": "user", "content": None}]}, r"messages\[0\]\.content: expected a string or a list of text parts, got None", id="content-none"),
    pytest.param(None, {"messages": [{"role": "user", "content": []}]}, r"messages\[0\]\.content: expected a string or a list of text parts, got list \[\]", id="content-no-parts"),
    pytest.param(None, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, r"messages\[0\]\.content\[0\]: expected a text part .*got a part of type 'image_url' \(rt serves text models only\)", id="content-image-part"),
    pytest.param(None, {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, r"messages\[0\]\.content\[0\]: expected a text part", id="content-part-int-text"),
    pytest.param(None, {"messages": [{"role": "user", "content": ["x"]}]}, r"messages\[0\]\.content\[0\]: expected a text part .*got 'x'", id="content-part-str"),
    pytest.param(None, {"messages": [{"role": 1, "content": "x"}]}, r"messages\[0\]\.role: expected a string", id="role-int"),
    pytest.param(None, {"messages": [{"role": "user", "content": "a\ud800"}]}, r"messages\[0\]\.content: .*not valid Unicode.* at position 1", id="surrogate-content"),
    pytest.param(None, {"messages": [{"role": "\udc00", "content": "x"}]}, r"messages\[0\]\.role: .*not valid Unicode", id="surrogate-role"),
    pytest.param([{"role": "user", "content": "x", 1: "y"}], {}, r"prompt\[0\]: expected string keys, got 1", id="int-key"),
    pytest.param(None, {"messages": [{"role": "user", "content": "x", "\ud800": 1}]}, r"messages\[0\]: a key: .*not valid Unicode", id="surrogate-key"),
    pytest.param(None, {"messages": [{**CHAT[0], "name": {"a": [1, "\udfff"]}}]}, r"messages\[0\]\.name\.a\[1\]: .*not valid Unicode", id="surrogate-nested"),
    pytest.param(None, {"messages": [{**CHAT[0], "x": math.nan}]}, r"messages\[0\]\.x: expected a finite number, got nan", id="nan-field"),
    pytest.param(None, {"messages": [{**CHAT[0], "x": BIG}]}, r"messages\[0\]\.x: expected a 64-bit integer", id="huge-field"),
    pytest.param(None, {"messages": [{**CHAT[0], "x": {1, 2}}]}, r"messages\[0\]\.x: expected a JSON value .* got set", id="set-field"),
    pytest.param(None, {"messages": [{**CHAT[0], "x": Opaque()}]}, r"messages\[0\]\.x: expected a JSON value .* got Opaque", id="object-field"),
    pytest.param(None, {"messages": [{**CHAT[0], "x": nested(MAX_JSON_DEPTH + 1)}]}, r"messages\[0\]\.x(\[0\])+: expected at most 32 levels", id="too-deep"),
    pytest.param(None, {"messages": [{**CHAT[0], "x": nested(5000)}]}, r"at most 32 levels", id="recursion"),
    # stop strings
    pytest.param("hi", {"stop": 5}, r"stop: expected a string or a list of strings, got 5", id="stop-int"),
    pytest.param("hi", {"stop": {"a": 1}}, r"stop: expected a string or a list of strings, got dict", id="stop-dict"),
    pytest.param("hi", {"stop": b"ab"}, r"stop: expected a string or a list of strings, got bytes", id="stop-bytes"),
    pytest.param("hi", {"stop": ""}, r"stop: expected a non-empty string, got ''", id="stop-empty"),
    pytest.param("hi", {"stop": ["a", ""]}, r"stop\[1\]: expected a non-empty string", id="stop-empty-in-list"),
    pytest.param("hi", {"stop": ["a", 5]}, r"stop\[1\]: expected a non-empty string, got 5", id="stop-int-in-list"),
    pytest.param("hi", {"stop": ["ok", "x\ud800"]}, r"stop\[1\]: .*not valid Unicode.* at position 1", id="stop-surrogate"),
    pytest.param("hi", {"stop": "\udfff"}, r"stop: .*not valid Unicode", id="stop-surrogate-string"),
    pytest.param("hi", {"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, r"stop: expected at most 64 stop strings, got 65", id="too-many-stops"),
    pytest.param("hi", {"stop": "x" * (MAX_STOP_CHARS + 1)}, r"stop: expected at most 1024 characters, got 1025", id="stop-too-long"),
    # sampling parameters: types
    pytest.param("hi", {"max_new_tokens": True}, r"max_new_tokens: expected an integer, got True", id="bool-int"),
    pytest.param("hi", {"max_new_tokens": "8"}, r"max_new_tokens: expected an integer, got '8'", id="str-int"),
    pytest.param("hi", {"min_new_tokens": None}, r"min_new_tokens: expected an integer, got None", id="none-int"),
    pytest.param("hi", {"max_new_tokens": 8.0}, r"max_new_tokens: expected an integer, got 8.0", id="float-int"),
    pytest.param("hi", {"n": 2.0}, r"n: expected an integer, got 2.0", id="n-float"),
    pytest.param("hi", {"top_k": True}, r"top_k: expected an integer, got True", id="top-k-bool"),
    pytest.param("hi", {"temperature": "0.5"}, r"temperature: expected a finite number, got '0.5'", id="str-float"),
    pytest.param("hi", {"temperature": True}, r"temperature: expected a finite number, got True", id="bool-float"),
    pytest.param("hi", {"temperature": 1j}, r"temperature: expected a finite number, got 1j", id="complex"),
    pytest.param("hi", {"temperature": np.float32(0.5)}, r"temperature: expected a finite number \(a Python int or float: convert this one with float\(\)\), got np.float32\(0.5\)", id="numpy-float"),
    pytest.param("hi", {"top_k": np.int64(3)}, r"top_k: expected an integer \(a Python int: convert this one with int\(\)\), got np.int64\(3\)", id="numpy-int"),
    pytest.param("hi", {"logprobs": 1}, r"logprobs: expected true or false, got 1", id="int-bool"),
    pytest.param("hi", {"ignore_eos": "yes"}, r"ignore_eos: expected true or false, got 'yes'", id="str-bool"),
    # sampling parameters: values
    pytest.param("hi", {"temperature": math.nan}, r"temperature: expected a finite number, got nan", id="nan"),
    pytest.param("hi", {"top_p": math.inf}, r"top_p: expected a finite number, got inf", id="inf"),
    pytest.param("hi", {"temperature": HUGE}, r"temperature: .* too large for a float", id="int-past-float"),
    pytest.param("hi", {"repetition_penalty": HUGE}, r"repetition_penalty: .* too large for a float", id="int-past-float-2"),
    pytest.param("hi", {"temperature": 1e308}, r"temperature: expected a number of magnitude at most 3.402823e\+38 \(the sampler computes in float32\), got 1e\+308", id="past-float32"),
    pytest.param("hi", {"repetition_penalty": 10**39}, r"repetition_penalty: expected a number of magnitude at most 3.402823e\+38", id="int-past-float32"),
    # a smaller one overflowed the sampler's float32 (token 0 every step)
    pytest.param("hi", {"repetition_penalty": 5e-324}, r"repetition_penalty: expected a number >= 1e-06", id="penalty-underflows"),
    pytest.param("hi", {"max_new_tokens": BIG}, r"max_new_tokens: expected an integer in \[1, 9223372036854775807\], got an integer of 100 bits", id="huge-int"),
    pytest.param("hi", {"top_k": 1 << 63}, r"top_k: expected an integer in \[-9223372036854775808, 9223372036854775807\]", id="top-k-past-int64"),
    pytest.param("hi", {"top_k": -(1 << 63) - 1}, r"top_k: expected an integer in", id="top-k-below-int64"),
    pytest.param("hi", {"top_k": 10**5000}, r"top_k: .*an integer of 16610 bits", id="int-past-repr"),
    pytest.param("hi", {"seed": -1}, r"seed: expected an integer in \[0, 9223372036854775807\], got -1", id="negative-seed"),
    pytest.param("hi", {"seed": 1 << 63}, r"seed: expected an integer in \[0, 9223372036854775807\]", id="seed-past-63-bits"),
    pytest.param("hi", {"seed": True}, r"seed: expected an integer, got True", id="bool-seed"),
    pytest.param("hi", {"n": 0}, r"n: expected an integer in \[1, 1024\], got 0", id="n-zero"),
    pytest.param("hi", {"n": 1025}, r"n: expected an integer in \[1, 1024\]", id="n-past-max"),
    pytest.param("hi", {"min_new_tokens": 9, "max_new_tokens": 8}, r"min_new_tokens: expected an integer in \[0, 8\], got 9", id="min-past-max"),
    pytest.param("hi", {"top_logprobs": 1025}, r"top_logprobs: expected an integer in \[0, 1024\]", id="top-logprobs"),
    # stop_token_ids
    pytest.param("hi", {"stop_token_ids": 5}, r"stop_token_ids: expected a list of token ids, got 5", id="stop-ids-int"),
    pytest.param("hi", {"stop_token_ids": "12"}, r"stop_token_ids: expected a list of token ids, got '12'", id="stop-ids-string"),
    pytest.param("hi", {"stop_token_ids": {1: 2}}, r"stop_token_ids: expected a list of token ids, got dict", id="stop-ids-dict"),
    pytest.param("hi", {"stop_token_ids": [1, VOCAB]}, r"stop_token_ids: expected token ids in \[0, 4096\), got 4096", id="stop-id-past-vocab"),
    pytest.param("hi", {"stop_token_ids": [True]}, r"stop_token_ids: expected token ids .* got True", id="stop-id-bool"),
    pytest.param("hi", {"stop_token_ids": [BIG]}, r"stop_token_ids: .*an integer of 100 bits", id="stop-id-huge"),
    # logit_bias
    pytest.param("hi", {"logit_bias": {"abc": 1.0}}, r"logit_bias: expected token ids \(integers, or decimal strings\) as keys, got 'abc'", id="bias-key-word"),
    pytest.param("hi", {"logit_bias": {" 5": 1.0}}, r"logit_bias: expected token ids .* got ' 5'", id="bias-key-space"),
    pytest.param("hi", {"logit_bias": {"5.0": 1.0}}, r"logit_bias: expected token ids .* got '5.0'", id="bias-key-float-string"),
    pytest.param("hi", {"logit_bias": {"٥": 1.0}}, r"logit_bias: expected token ids .* got '٥'", id="bias-key-arabic-digit"),
    pytest.param("hi", {"logit_bias": {"9" * 5000: 1.0}}, r"logit_bias: expected token ids .* got '9999", id="bias-key-past-int-parsing"),
    pytest.param("hi", {"logit_bias": {"-1": 1.0}}, r"logit_bias: expected token ids .* got '-1'", id="bias-key-negative-string"),
    pytest.param("hi", {"logit_bias": {-1: 1.0}}, r"logit_bias: expected token ids in \[0, 4096\), got -1", id="bias-key-negative"),
    pytest.param("hi", {"logit_bias": {True: 1.0}}, r"logit_bias: expected token ids .* got True", id="bias-key-bool"),
    pytest.param("hi", {"logit_bias": {"5": 1.0, 5: 2.0}}, r"logit_bias: token id 5 appears twice", id="bias-key-twice"),
    pytest.param("hi", {"logit_bias": {5: [1.0]}}, r"logit_bias\[5\]: expected a finite number, got \[1.0\]", id="bias-list"),
    pytest.param("hi", {"logit_bias": {5: {"a": 1}}}, r"logit_bias\[5\]: expected a finite number", id="bias-dict"),
    pytest.param("hi", {"logit_bias": {5: math.nan}}, r"logit_bias\[5\]: expected a finite number, got nan", id="bias-nan"),
    pytest.param("hi", {"logit_bias": {5: 101}}, r"logit_bias\[5\]: expected a number in \[-100, 100\], got 101", id="bias-range"),
    pytest.param("hi", {"logit_bias": {5: HUGE}}, r"logit_bias\[5\]: .* too large for a float", id="bias-huge"),
    pytest.param("hi", {"logit_bias": [[5, 1.0]]}, r"logit_bias: expected an object mapping token ids to biases, got list", id="bias-list-of-pairs"),
    pytest.param("hi", {"logit_bias": "5"}, r"logit_bias: expected an object .* got '5'", id="bias-string"),
    # the other options
    pytest.param("hi", {"skip_special_tokens": "no"}, r"skip_special_tokens: expected true or false, got 'no'", id="skip-string"),
    pytest.param("hi", {"spaces_between_special_tokens": 0}, r"spaces_between_special_tokens: expected true or false, got 0", id="spaces-int"),
    pytest.param("hi", {"allow_auto_truncate": None}, r"allow_auto_truncate: expected true or false, got None", id="truncate-none"),
    pytest.param("hi", {"truncate_prompt_tokens": 0}, r"truncate_prompt_tokens: expected a number of tokens >= 1 .* or -1 .* got 0", id="keep-0"),
    pytest.param("hi", {"truncate_prompt_tokens": -2}, r"truncate_prompt_tokens: .* got -2", id="keep-negative"),
    pytest.param("hi", {"truncate_prompt_tokens": 2.0}, r"truncate_prompt_tokens: .* got 2.0", id="keep-float"),
    pytest.param("hi", {"truncate_prompt_tokens": True}, r"truncate_prompt_tokens: .* got True", id="keep-bool"),
    pytest.param("hi", {"truncate_prompt_tokens": 10**30}, r"truncate_prompt_tokens: .* got an integer of 100 bits", id="keep-past-64-bits"),
    pytest.param("hi", {"add_special_tokens": 1}, r"add_special_tokens: expected true, false or none, got 1", id="add-special-int"),
    pytest.param("hi", {"priority": "high"}, r"priority: expected an integer, got 'high'", id="priority-string"),
    pytest.param("hi", {"priority": 1.5}, r"priority: expected an integer, got 1.5", id="priority-float"),
    pytest.param("hi", {"priority": True}, r"priority: expected an integer, got True", id="priority-bool"),
    pytest.param("hi", {"priority": 1 << 63}, r"priority: expected an integer in \[-9223372036854775808, 9223372036854775807\]", id="priority-huge"),
    pytest.param("hi", {"rid": 5}, r"rid: expected a string, got 5", id="rid-int"),
    pytest.param("hi", {"rid": 0}, r"rid: expected a string, got 0", id="rid-falsy-int"),
    pytest.param("hi", {"rid": b"r"}, r"rid: expected a string, got bytes", id="rid-bytes"),
    pytest.param("hi", {"rid": "r" * 1025}, r"rid: expected at most 1024 characters, got 1025", id="rid-too-long"),
    pytest.param("hi", {"rid": "r\ud800"}, r"rid: .*not valid Unicode.* at position 1", id="rid-surrogate"),
    pytest.param("hi", {"max_tokens": 8}, r"unknown parameter\(s\) 'max_tokens'; expected sampling parameters", id="unknown"),
    pytest.param("hi", {"b": 1, 2: 3}, r"unknown parameter\(s\) 'b', 2", id="unknown-mixed-keys"),
]  # fmt: skip


@pytest.mark.parametrize(("prompt", "options", "message"), REFUSED)
def test_a_bad_argument_is_refused_by_name(prompt: Any, options: Any, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message) as caught:
        build_request(prompt, options, VOCAB)
    str(caught.value).encode()  # the message itself is printable: a surrogate shows escaped


def test_a_chat_message_the_tokenizer_could_not_read_is_refused_here() -> None:
    with pytest.raises(InvalidRequestError, match=r"messages\[0\]: expected string keys"):
        build_request(None, {"messages": [{**CHAT[0], 1: "not a str key"}]}, VOCAB)


def test_an_accepted_request_is_what_the_tokenizer_will_read() -> None:
    req = build_request(None, {"input_ids": [5, 6, 7], "stop_token_ids": [2], "rid": "r"}, VOCAB)
    assert isinstance(req, GenerateRequest)
    assert req.rid == "r" and req.input_ids == (5, 6, 7)
    assert req.sampling.stop_token_ids == (2,) and isinstance(req.sampling.seed, int)


def test_an_assistant_message_that_calls_tools_may_have_no_content() -> None:
    """As OpenAI's API has it (and vLLM takes it): content null or left out."""
    calls = {"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f"}}]}
    for message in (
        {"role": "assistant", "content": None, **calls},
        {"role": "assistant", **calls},
    ):
        req = build_request(None, {"messages": [*CHAT, message]}, VOCAB)
        assert req.messages[1] == {"role": "assistant", "content": "", **calls}
    with pytest.raises(InvalidRequestError, match=r"messages\[1\]\.content: expected a string"):
        build_request(None, {"messages": [*CHAT, {"role": "assistant", "content": None}]}, VOCAB)


def test_text_parts_of_a_chat_message_are_its_text_joined_by_newlines() -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two", "extra": 1}]
    req = build_request(
        None, {"messages": [{"role": "user", "content": parts, "name": "a"}]}, VOCAB
    )
    assert req.messages == ({"role": "user", "content": "one\ntwo", "name": "a"},)


@pytest.mark.parametrize(
    ("prompt", "options"),
    [
        ("", {}),  # the tokenizer adds BOS, or refuses an empty prompt itself
        ("a\x00b\U0010ffff\ufffe", {"stop": "\x00"}),  # odd, but valid Unicode
        ("😀 e\u0301", {"stop": ["😀", "\u0301"]}),  # surrogate pairs are fine
        ([0, VOCAB - 1], {}),
        (range(3), {}),
        (None, {"input_ids": (1, 2)}),
        (CHAT, {}),
        (
            None,
            {
                "messages": [
                    {"role": "system", "content": ""},
                    {
                        **CHAT[0],
                        "name": "x",
                        "tool_calls": [{"function": {"arguments": '{"a": 1}', "n": 1.5}}],
                        "weird key": None,
                    },
                ]
            },
        ),
        (None, {"messages": [{**CHAT[0], "x": nested(MAX_JSON_DEPTH - 1)}]}),
        ("hi", {"top_k": -(1 << 63), "priority": (1 << 63) - 1}),
        ("hi", {"top_k": (1 << 63) - 1, "priority": -(1 << 63)}),
        ("hi", {"seed": 0, "n": 1024, "top_logprobs": 1024, "logprobs": True}),
        ("hi", {"seed": SEED_MASK, "max_new_tokens": (1 << 63) - 1}),  # the tokenizer says overflow
        ("hi", {"temperature": FLOAT32_MAX, "repetition_penalty": 1e-6, "top_p": 5e-324}),
        ("hi", {"stop": ["x" * MAX_STOP_CHARS] * MAX_STOP_STRINGS}),
        ("hi", {"stop": None, "stop_token_ids": None, "logit_bias": None, "seed": None}),
        ("hi", {"rid": ""}),  # no rid: one is made
        ("hi", {"rid": "a/b c"}),
    ],
)
def test_edge_values_are_accepted(prompt: Any, options: dict[str, Any]) -> None:
    req = build_request(prompt, options, VOCAB)
    assert isinstance(msgspec.msgpack.encode(req), bytes)  # MessagePack, not the pickle fallback


def test_a_chat_message_with_too_many_values_is_refused_by_where() -> None:
    junk = [{}] * MAX_JSON_VALUES  # the message itself and its role and content count too
    with pytest.raises(
        InvalidRequestError, match=r"^messages\[0\]\.junk\[99996\]: expected at most"
    ):
        build_request(None, {"messages": [{**CHAT[0], "junk": junk}]}, VOCAB)
    build_request(None, {"messages": [{**CHAT[0], "junk": junk[:-4]}]}, VOCAB)


def test_stop_token_ids_are_kept_once_each_in_order() -> None:
    # 2M repeats (12 MB of JSON) once took the scheduler ~200 ms a step, every
    # other client waiting: it rebuilt the set of stop ids for every token.
    req = build_request("hi", {"stop_token_ids": [9, 5] * 1_000_000 + [7, 9]}, VOCAB)
    assert req.sampling.stop_token_ids == (9, 5, 7)
    for ids in ([1, True], [7, 7.0]):  # equal as keys, but not token ids: still refused
        with pytest.raises(InvalidRequestError, match=r"^stop_token_ids"):
            build_request("hi", {"stop_token_ids": ids}, VOCAB)


def test_top_logprobs_past_the_engines_max_logprobs_are_refused() -> None:
    build_request("hi", {"top_logprobs": 20}, VOCAB, None, "fcfs", 20)
    with pytest.raises(InvalidRequestError, match=r"^top_logprobs: expected at most 20 "):
        build_request("hi", {"top_logprobs": 21}, VOCAB, None, "fcfs", 20)


def test_what_is_repaired() -> None:
    req = build_request(
        "hi",
        {
            "temperature": 1,
            "top_p": 1,
            "repetition_penalty": 10**30,
            "logit_bias": {"5": 1, 7: -100},
            "stop": "end",
        },
        VOCAB,
    )
    s = req.sampling
    assert type(s.temperature) is float and type(s.top_p) is float
    assert s.repetition_penalty == 1e30 and type(s.repetition_penalty) is float
    assert dict(s.logit_bias) == {5: 1.0, 7: -100.0}
    assert all(type(b) is float for b in s.logit_bias.values())
    assert req.detok.stop == ("end",)
    none = build_request("hi", {"stop": None, "stop_token_ids": None, "logit_bias": None}, VOCAB)
    assert none.detok.stop == () and none.sampling.stop_token_ids == ()
    assert dict(none.sampling.logit_bias) == {}
    assert 0 <= none.sampling.seed <= SEED_MASK  # type: ignore[operator]
    assert len(build_request("hi", {"rid": None}, VOCAB).rid) == 32


class Text(str):
    def __str__(self) -> str:  # not called: the plain value is taken as it is
        raise AssertionError("called")


class Count(int):
    pass


class Ratio(float):
    pass


def test_subclasses_of_str_int_and_float_are_taken_as_their_plain_values() -> None:
    """They passed every check, then failed to encode with a message naming no field."""
    options = {"rid": Text("r"), "stop": [Text("end")], "max_new_tokens": Count(3)}
    req = build_request(Text("hi"), {**options, "temperature": Ratio(0.5)}, VOCAB)
    assert (req.text, req.rid, req.detok.stop) == ("hi", "r", ("end",))
    assert type(req.text) is str and type(req.rid) is str and type(req.detok.stop[0]) is str
    assert req.sampling.max_new_tokens == 3 and type(req.sampling.max_new_tokens) is int
    assert req.sampling.temperature == 0.5 and type(req.sampling.temperature) is float
    ids = build_request([Count(5), Count(6)], {}, VOCAB).input_ids
    assert ids == (5, 6) and all(type(i) is int for i in ids)


def test_mappings_that_are_no_dicts_are_taken_as_dicts() -> None:
    """A UserDict or a MappingProxyType passed every check as an object, then failed
    to encode with a raw NotImplementedError."""
    meta = UserDict(a=1)
    chat = [{"role": "user", "content": "hi", "meta": meta}]
    kwargs = MappingProxyType({"opts": UserDict(b=MappingProxyType({"c": 2}))})
    req = build_request(chat, {"chat_template_kwargs": kwargs}, VOCAB)
    assert req.messages is not None and req.messages[0]["meta"] == {"a": 1}
    assert req.template_kwargs == {"opts": {"b": {"c": 2}}}
    user = build_request([UserDict(role="user", content="hi")], {}, VOCAB)
    assert user.messages == ({"role": "user", "content": "hi"},)


def test_float_fields_are_the_sampling_parameters_typed_float() -> None:
    assert sorted(FLOAT_FIELDS) == [
        "frequency_penalty",
        "min_p",
        "presence_penalty",
        "repetition_penalty",
        "temperature",
        "top_p",
    ]


def test_truncate_prompt_tokens_past_the_context_is_refused() -> None:
    """More than the context length cuts nothing: vLLM refuses it; here a prompt of
    602 tokens was refused for its length, the message advising the very option."""
    with pytest.raises(InvalidRequestError, match=r"at most the context length \(16\).* got 17"):
        build_request("hi", {"truncate_prompt_tokens": 17}, VOCAB, 16)
    assert build_request("hi", {"truncate_prompt_tokens": 16}, VOCAB, 16).keep_last == 16


def test_a_prompt_of_ids_over_the_context_is_refused_with_advice_that_helps() -> None:
    """Its length at fault: shorten it or cut it. max_new_tokens alone filling the
    context: no cut helps (the advice to set allow_auto_truncate was a dead end)."""
    ids = list(range(10, 30))
    with pytest.raises(ContextOverflowError, match=r"20 tokens.*or set allow_auto_truncate$"):
        build_request(None, {"input_ids": ids, "max_new_tokens": 4}, VOCAB, 16)
    with pytest.raises(ContextOverflowError) as err:
        build_request(None, {"input_ids": ids, "max_new_tokens": 16}, VOCAB, 16)
    assert str(err.value) == (
        "max_new_tokens is 16, which leaves no room for the prompt in the context "
        "length 16; lower max_new_tokens"
    )


def test_truncate_prompt_tokens_keeps_the_prompts_end() -> None:
    """vLLM's per-request truncation: k keeps the last k ids (cut here, counted as
    truncated; a text is cut by the tokenizer), -1 cuts to the context as
    allow_auto_truncate does."""
    ids = list(range(10, 30))
    req = build_request(None, {"input_ids": ids, "truncate_prompt_tokens": 5}, VOCAB, 16)
    assert req.input_ids == tuple(ids[-5:]) and req.truncated == 15 and not req.allow_auto_truncate
    short = build_request(None, {"input_ids": ids[:3], "truncate_prompt_tokens": 5}, VOCAB, 16)
    assert short.input_ids == tuple(ids[:3]) and short.truncated == 0
    to_context = build_request(None, {"input_ids": ids, "truncate_prompt_tokens": -1}, VOCAB, 16)
    assert to_context.allow_auto_truncate and to_context.keep_last == 0
    assert to_context.input_ids == tuple(ids[-16:]) and to_context.truncated == 4
    text = build_request("a long text", {"truncate_prompt_tokens": 3}, VOCAB, 16)
    assert text.keep_last == 3 and text.text == "a long text"
    # a bad id the cut drops is no matter; one it keeps is named where the caller put it
    assert build_request(None, {"input_ids": [-1, 5], "truncate_prompt_tokens": 1}, VOCAB, 16)
    with pytest.raises(InvalidRequestError, match=r"input_ids\[1\]: expected a token id"):
        build_request(None, {"input_ids": [5, -1], "truncate_prompt_tokens": 1}, VOCAB, 16)


def test_chat_template_kwargs_go_with_a_chat_prompt_and_are_checked() -> None:
    kwargs = {"enable_thinking": False, "reasoning_effort": "low", "continue_final_message": True}
    req = build_request(CHAT, {"chat_template_kwargs": kwargs}, VOCAB)
    assert req.template_kwargs == kwargs
    assert build_request(CHAT, {}, VOCAB).template_kwargs is None
    refusals = [
        ("text", {"x": 1}, "chat_template_kwargs: only for a prompt of chat messages"),
        (CHAT, ["x"], "chat_template_kwargs: expected an object, got"),
        (CHAT, {"tokenize": True, "tools": []}, "tokenize, tools cannot be set"),
        (CHAT, {"add_generation_prompt": "yes"}, "add_generation_prompt: expected a bool"),
        (CHAT, {"x": float("nan")}, r"chat_template_kwargs\.x: expected a finite number"),
        (
            CHAT,
            {"add_generation_prompt": True, "continue_final_message": True},
            "expected at most one of them true",
        ),
    ]
    for prompt, value, says in refusals:
        with pytest.raises(InvalidRequestError, match=says):
            build_request(prompt, {"chat_template_kwargs": value}, VOCAB)

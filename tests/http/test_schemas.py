"""Request validation messages (no server): each names the field, says what
was expected and what arrived; and what rt.http exports."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rt.http
from rt.http.asgi import HTTPError
from rt.http.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    loads,
    parse,
)


@pytest.mark.parametrize(
    ("model", "body", "param", "message"),
    [
        (GenerateRequest, b"[1]", None, "the body must be a JSON object, got list [1]"),
        # unknown keys are trimmed to the first before pydantic: its first error is kept
        (
            CompletionRequest,
            b'{"prompt": "x", "stream_options": [{"bogus": 1}]}',
            "stream_options",
            "stream_options: input should be a valid dictionary or instance of StreamOptions",
        ),
        (
            CompletionRequest,
            b'{"prompt": 5, "zzz": 1, "yyy": 2}',
            "prompt",
            "prompt: expected str or list[str] or list[int] or list[list[int]]; got 5",
        ),
        (
            GenerateRequest,
            b'{"text": "x", "sampling_params": {"temperature": "hot", "b": 1, "c": 2}}',
            "sampling_params.temperature",
            "sampling_params.temperature: input should be a valid number (got 'hot')",
        ),
        (
            GenerateRequest,
            b'{"text": "x", "sampling_params": [{"n": 1}, {"b": 1, "c": 2}]}',
            "sampling_params[1].b",
            "sampling_params[1].b: unknown field (got 1)",
        ),
        (GenerateRequest, b'{"text": ', None, "the body is not valid JSON: Expecting value"),
        (
            GenerateRequest,
            b'{"text": "x", "sampling_params": {"temperature": "hot"}}',
            "sampling_params.temperature",
            "sampling_params.temperature: input should be a valid number (got 'hot')",
        ),
        (
            GenerateRequest,
            b'{"text": "x", "sampling_params": [{"n": 2.5}]}',
            "sampling_params[0].n",
            "sampling_params[0].n: input should be a valid integer (got 2.5)",
        ),
        (
            GenerateRequest,
            b'{"text": "x", "sampling_params": {"tempreature": 1}}',
            "sampling_params.tempreature",
            "sampling_params.tempreature: unknown field (got 1)",
        ),
        (
            CompletionRequest,
            b'{"prompt": [1, "a"]}',
            "prompt",
            "prompt: expected str or list[str] or list[int] or list[list[int]]; got list [1, 'a']",
        ),
        (CompletionRequest, b"{}", "prompt", "prompt: this field is required"),
        (
            CompletionRequest,
            b'{"prompt": "x", "stream": 1}',
            "stream",
            "stream: input should be a valid boolean (got 1)",
        ),
        (
            ChatCompletionRequest,
            b'{"messages": [{"role": "user", "content": 3}]}',
            "messages[0].content",
            "messages[0].content: expected str or list[any]; got 3",
        ),
    ],
)
def test_messages_name_the_field(model: type, body: bytes, param: str | None, message: str) -> None:
    with pytest.raises(HTTPError) as err:
        parse(model, body)
    assert err.value.status == 400
    assert err.value.param == param
    assert err.value.message.startswith(message)


def test_a_lone_surrogate_passes_to_the_engine_which_names_it() -> None:
    # The standard library keeps the escape; the engine then refuses the text by position.
    assert parse(GenerateRequest, b'{"text": "a\\ud800"}').text == "a\ud800"


def test_rt_http_exports() -> None:
    assert sorted(rt.http.__all__) == ["App", "Front", "Settings", "serve"]


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)  # past 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.booleans())
def test_bodies_parse_to_what_the_standard_library_gives(value: Any, ascii_only: bool) -> None:
    """msgspec parses first (5× faster); what it returns must be what json would."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    for data in (text, text.encode("utf-8", "surrogatepass")):
        got, expected = loads(data), json.loads(data)
        assert got == expected and json.dumps(got) == json.dumps(expected)


def test_what_msgspec_refuses_is_the_standard_librarys_to_answer() -> None:
    assert loads('{"a": "\\ud800"}') == {"a": "\ud800"}  # refused later by name and position
    assert math.isnan(loads('{"a": NaN}')["a"])
    assert loads('{"a": 1e400}') == {"a": math.inf}
    assert loads(b"\xef\xbb\xbf{}") == {}  # a UTF-8 BOM
    with pytest.raises(HTTPError, match="not valid JSON: Expecting value: line 1 column 1"):
        loads("nope")
    with pytest.raises(HTTPError, match="nests lists or objects too deeply"):
        loads("[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize(
    ("model", "body", "says"),
    [
        # content parts take anything: a first item that is a number kept the rest unchecked
        (
            ChatCompletionRequest,
            {"messages": [{"role": "u", "content": [0] + [[]] * 70_000}]},
            "messages[0].content: expected at most 65536 items, got 70001",
        ),
        # a message's own fields are kept as they are, so they are bounded too
        (
            ChatCompletionRequest,
            {"messages": [{"role": "u", "content": "x", "x": [[]] * 70_000}]},
            "messages[0].x: expected at most 65536 items",
        ),
        (GenerateRequest, {"text": ["a"] * 70_000}, "text: expected at most 65536 items"),
        # dicts too: each entry valid, so pydantic would have built them all
        (
            CompletionRequest,
            {"prompt": "x", "logit_bias": {str(i): 1.0 for i in range(70_000)}},
            "logit_bias: expected at most 65536 items, got 70000",
        ),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "u", "content": "x", "x": {str(i): 0 for i in range(70_000)}}]},
            "messages[0].x: expected at most 65536 items",
        ),
    ],
)
def test_long_lists_are_refused_before_pydantic_whatever_their_first_item(
    model: type, body: dict[str, Any], says: str
) -> None:
    with pytest.raises(HTTPError) as err:
        parse(model, json.dumps(body).encode())
    assert err.value.status == 400 and str(err.value).startswith(says)


def test_a_long_list_of_token_ids_is_a_prompt_not_a_batch() -> None:
    assert len(parse(CompletionRequest, {"prompt": [1] * 100_000}).prompt) == 100_000
    assert len(parse(GenerateRequest, {"input_ids": [1] * 100_000}).input_ids or ()) == 100_000


def test_a_clients_field_name_is_shown_escaped_and_cut(caplog: pytest.LogCaptureFixture) -> None:
    """An ignored field's name went to the log as it came: a line break in it forged
    a log line of its own, and a 4 MiB name took 4 MiB of the log; so did the 400
    naming an unknown field."""
    forged = "x\n2026-11-29 ERROR rt.actors: actor 'scheduler' crashed"
    long = "y" * (4 << 20)
    with caplog.at_level("INFO", logger="rt.http.schemas"):
        parse(CompletionRequest, {"prompt": "p", forged: None, long: None})
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "not rt's and asks for nothing" in logged
    assert "\n2026" not in logged and "\\n2026" in logged
    assert len(logged) < 1000, len(logged)
    with pytest.raises(HTTPError) as refused:
        parse(CompletionRequest, {"prompt": "p", long: 1})
    assert refused.value.status == 400
    assert "unknown field" in str(refused.value) and len(str(refused.value)) < 300


def test_an_integer_too_long_to_read_is_named_without_pythons_advice() -> None:
    """A 5,000-digit number's 400 advised sys.set_int_max_str_digits() (Python's
    words, for Python code), as an id on /ws and in any body."""
    with pytest.raises(HTTPError) as err:
        loads('{"id": ' + "9" * 5000 + "}")
    assert err.value.status == 400
    assert err.value.message == "the body has an integer of more than 4300 digits"

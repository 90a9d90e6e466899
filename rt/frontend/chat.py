"""Chat prompts' parts of a request: the messages, the chat template's
variables, and the JSON values they may hold (checked as rt/frontend/requests.py
checks everything: an InvalidRequestError naming the field). Light to import
(no numpy): rt.client checks what it sends with ``json_value`` too."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rt.errors import InvalidRequestError
from rt.gpu.sampling_params import INT64_MAX, INT64_MIN, show

if TYPE_CHECKING:
    from rt.messages import ChatMessage

MAX_JSON_DEPTH = 32  # nesting inside a chat message (tool calls and the like)
# values (strings, numbers, lists, objects...) in a request's messages: 15 MB of ``{}`` in a
# field the template never reads were 5M objects, 4 GB of the front's memory and seconds of
# the tokenizer's time each
MAX_JSON_VALUES = 100_000
# apply_chat_template's own parameters: set by the tokenizer, not a template's variables
RESERVED_TEMPLATE_KWARGS = {
    *("conversation", "messages", "tools", "documents", "chat_template", "tokenize"),
    *("padding", "truncation", "max_length", "return_tensors", "return_dict"),
    *("return_assistant_tokens_mask", "tokenizer_kwargs", "processor_kwargs"),
}


def chat_messages(name: str, messages: Sequence[Any]) -> tuple[ChatMessage, ...]:
    out = []
    budget = [MAX_JSON_VALUES]
    for i, msg in enumerate(messages):
        where = f"{name}[{i}]"
        if not isinstance(msg, Mapping):
            raise InvalidRequestError(
                f"{where}: expected a chat message (an object with 'role' and 'content'), "
                f"got {described(msg)}"
            )
        if _calls_tools(msg) and msg.get("content") is None:  # OpenAI lets it have no text
            msg = {**msg, "content": ""}
        for key in ("role", "content"):
            if key not in msg:
                raise InvalidRequestError(
                    f"{where}: expected a '{key}' field, got the fields "
                    f"{', '.join(sorted(map(show, msg))) or 'none'}"
                )
        if not isinstance(msg["role"], str):
            raise InvalidRequestError(
                f"{where}.role: expected a string, got {described(msg['role'])}"
            )
        json_value(where, msg, 0, budget)
        out.append({**msg, "content": _content(f"{where}.content", msg["content"])})
    return tuple(out)


def _calls_tools(msg: Mapping[str, Any]) -> bool:
    """An assistant's message that calls tools, whose content may be null or left out."""
    return msg.get("role") == "assistant" and bool(
        msg.get("tool_calls") or msg.get("function_call")
    )


def _content(where: str, content: Any) -> str:
    """A message's text: a string, or OpenAI's content parts when every one is
    text (``{"type": "text", "text": ...}``), joined by newlines as vLLM does."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise InvalidRequestError(
            f"{where}: expected a string or a list of text parts, got {described(content)}"
        )
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            got = f"a part of type {show(kind)}" if kind is not None else described(part)
            raise InvalidRequestError(
                f"{where}[{i}]: expected a text part ({{'type': 'text', 'text': <string>}}), "
                f"got {got} (rt serves text models only)"
            )
        texts.append(part["text"])
    return "\n".join(texts)


def json_value(where: str, value: Any, depth: int, budget: list[int]) -> None:
    """A value MessagePack carries as JSON would (string keys; finite numbers;
    integers in 64 bits; valid Unicode), at most MAX_JSON_DEPTH levels deep;
    ``budget`` counts down the values it may still hold (MAX_JSON_VALUES)."""
    budget[0] -= 1
    if budget[0] < 0:
        whole = where.split("[")[0].split(".")[0]  # (the limit is the field's, in all)
        raise InvalidRequestError(
            f"{where}: expected at most {MAX_JSON_VALUES} values (strings, numbers, lists, "
            f"objects) in all of {whole}, and this one is past them; send fewer or smaller"
        )
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        check_unicode(where, value)
    elif isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise InvalidRequestError(f"{where}: expected a 64-bit integer, got {show(value)}")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequestError(f"{where}: expected a finite number, got {value!r}")
    elif depth >= MAX_JSON_DEPTH:
        raise InvalidRequestError(
            f"{where}: expected at most {MAX_JSON_DEPTH} levels of nested lists and objects"
        )
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidRequestError(f"{where}: expected string keys, got {show(key)}")
            check_unicode(f"{where}: a key", key)
            inner = f"{where}.{key}" if key.isidentifier() else f"{where}[{key!r}]"
            json_value(inner, item, depth + 1, budget)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            json_value(f"{where}[{i}]", item, depth + 1, budget)
    else:
        raise InvalidRequestError(
            f"{where}: expected a JSON value (a string, number, bool, null, list or object), "
            f"got {described(value)}"
        )


def described(value: Any) -> str:
    """What arrived, for an error message: the type too, where the value does not show it."""
    if value is None or isinstance(value, bool | int | float | str):
        return show(value)
    return f"{type(value).__name__} {show(value)}"


def check_unicode(where: str, text: str) -> None:
    """Refuse a lone surrogate: a JSON string can carry one (``"\\ud800"``), but
    it is not Unicode text, and the tokenizer cannot encode it."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InvalidRequestError(
            f"{where}: the text is not valid Unicode: a lone surrogate {text[err.start]!r} "
            f"at position {err.start}; expected UTF-8 text (a \\ud800-\\udfff escape must be "
            "half of a surrogate pair)"
        ) from err


def template_kwargs(kwargs: Any, chat: bool) -> dict[str, Any] | None:
    """``chat_template_kwargs``: the chat template's variables (``enable_thinking``,
    ``reasoning_effort``, …, and ``add_generation_prompt``, True unless
    ``continue_final_message``, which leaves the last message open to go on)."""
    if kwargs is None:
        return None
    if not isinstance(kwargs, Mapping):
        raise InvalidRequestError(f"chat_template_kwargs: expected an object, got {show(kwargs)}")
    if not chat:
        raise InvalidRequestError("chat_template_kwargs: only for a prompt of chat messages")
    json_value("chat_template_kwargs", kwargs, 0, [MAX_JSON_VALUES])
    taken = sorted(RESERVED_TEMPLATE_KWARGS & kwargs.keys())
    if taken:
        raise InvalidRequestError(
            f"chat_template_kwargs: {', '.join(taken)} cannot be set (the tokenizer sets it)"
        )
    for flag in ("add_generation_prompt", "continue_final_message"):
        if not isinstance(kwargs.get(flag, False), bool):
            raise InvalidRequestError(
                f"chat_template_kwargs.{flag}: expected a bool, got {show(kwargs[flag])}"
            )
    if kwargs.get("continue_final_message") and kwargs.get("add_generation_prompt"):
        raise InvalidRequestError(
            "chat_template_kwargs: continue_final_message goes on with the last message, "
            "add_generation_prompt starts a new one; expected at most one of them true"
        )
    return dict(kwargs)

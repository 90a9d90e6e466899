"""Request bodies, as pydantic models: they validate each body and make the
OpenAPI document (``/openapi.json``).

Validation is strict (JSON types as written: ``"2"`` is not a number, ``1``
is not a bool; but a whole float is an integer, ``2.0`` as ``2``, as Python's
``/`` makes them) and an unknown field is refused: a misspelt sampling
parameter silently ignored would be a wrong answer, not a lenient one. But an
unknown field that asks for nothing (``null``, ``false``, or a default in
``FOREIGN_DEFAULTS``) is left out, with a log line, as vLLM and
SGLang ignore it: clients written for them send their whole set of options
(SGLang's ``sgl.gen`` sends ``"regex": null``, its bench ``"lora_path": null``).
A ``null`` means "not given". Ranges are left to the engine, whose messages
name the field (``rt.frontend.requests``): one place decides what a valid
temperature is.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
import sys
import typing
from collections.abc import Iterator
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import pydantic
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from rt.gpu.sampling_params import show
from rt.http.asgi import HTTPError

log = logging.getLogger(__name__)


def _whole(value: Any) -> Any:
    """A float with no fraction as the integer it is (``2.0``: 2); else as it came."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_whole)]
STRICT = ConfigDict(extra="forbid", strict=True)
# Every list and dict stops at its first bad item. pydantic's default reports them
# all, each error holding hundreds of bytes: a 13 MiB body of nulls as a prompt took
# 8 GiB and a minute of the event loop to refuse (a union tries each of its lists),
# and a valid 10 MiB id prompt 1.3 GiB (its list[str] alternative failed item by item).
FAST = Field(fail_fast=True)
Ints = Annotated[list[int], FAST]
Strs = Annotated[list[str], FAST]
IntLists = Annotated[list[Ints], FAST]
Stop = str | Strs
Prompt = str | Strs | Ints | IntLists


class SamplingParams(BaseModel):
    """SGLang's ``sampling_params`` (the subset rt implements)."""

    model_config = STRICT
    max_new_tokens: Int | None = None
    min_new_tokens: Int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: Stop | None = None
    stop_token_ids: Ints | None = None
    no_stop_trim: bool | None = Field(
        default=None, description="a stop string that ends the output stays in its text"
    )
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    n: Int | None = None
    seed: Int | None = Field(
        default=None, description="the sampling seed; each of the n samples derives its own"
    )
    sampling_seed: Int | None = Field(default=None, description="the same, SGLang's name")
    logit_bias: Annotated[dict[str, float], FAST] | None = None


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = Field(
        default=None,
        description="each chunk's usage so far (vLLM's; implies include_usage unless it is false)",
    )
    include_obfuscation: bool | None = Field(
        default=None, description="accepted and ignored: rt pads no events"
    )


class GenerateRequest(BaseModel):
    """``POST /generate`` (SGLang's native API). One of ``text`` or
    ``input_ids``; a list of them is a batch, answered with a list."""

    model_config = STRICT
    text: str | Strs | None = None
    input_ids: Ints | IntLists | None = None
    sampling_params: SamplingParams | Annotated[list[SamplingParams], FAST] | None = None
    stream: bool | None = None
    return_logprob: bool | None = None
    top_logprobs_num: Int | None = None
    return_text_in_logprobs: bool | None = None
    logprob_start_len: Int | None = Field(
        default=None,
        description="with return_logprob: the prompt's logprobs from this position "
        "(input_token_logprobs); -1 or absent: none",
    )
    rid: str | Strs | None = None
    priority: Int | None = None
    model: str | None = Field(default=None, description="the served model's name, if given")
    stream_options: StreamOptions | None = Field(
        default=None, description="accepted and ignored: each event's meta_info has the counts"
    )


class OpenAISampling(BaseModel):
    """Fields the two OpenAI generation endpoints share, with vLLM's and
    SGLang's usual extensions (``top_k``, ``min_p``, ``repetition_penalty``,
    ``min_tokens``, ``ignore_eos``, ``stop_token_ids``, …)."""

    model_config = STRICT
    model: str | None = None
    max_tokens: Int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: Int | None = None
    stop: Stop | None = None
    seed: Int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: Annotated[dict[str, float], FAST] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    top_k: Int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: Int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: Ints | None = None
    allowed_token_ids: Ints | None = Field(
        default=None, description="only these token ids may be drawn (vLLM's)"
    )
    include_stop_str_in_output: bool | None = Field(
        default=None, description="a stop string that ends the output stays in its text (vLLM)"
    )
    no_stop_trim: bool | None = Field(default=None, description="the same, SGLang's name")
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    response_format: Any = Field(
        default=None, description="only {'type': 'text'}: rt has no constrained decoding yet"
    )
    rid: str | None = Field(default=None, description="the request id, for /abort_request")
    request_id: str | None = Field(default=None, description="the same, vLLM's name")
    return_token_ids: bool | None = Field(
        default=None,
        description="vLLM's: each choice's token ids (token_ids) and the prompt's "
        "(prompt_token_ids) beside the text; a stream sends each chunk's new ids, "
        "and the prompt's in its first chunk",
    )
    priority: Int | None = None
    add_special_tokens: bool | None = Field(
        default=None,
        description="add the tokenizer's special tokens (BOS) to the prompt; default: "
        "yes for completions, no for chat, whose template writes them (vLLM)",
    )
    return_tokens_as_token_ids: bool | None = Field(
        default=None, description="logprobs name each token 'token_id:N' (vLLM)"
    )
    truncate_prompt_tokens: Int | None = Field(
        default=None,
        description="keep the prompt's last k tokens; -1: cut it to fit the context (vLLM)",
    )
    # Accepted and ignored: they change nothing about the output (rt's prefix
    # cache needs no key).
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    metadata: Annotated[dict[str, str], FAST] | None = None
    store: bool | None = None
    service_tier: str | None = None


class CompletionRequest(OpenAISampling):
    """``POST /v1/completions``."""

    prompt: Prompt
    echo: bool | None = None
    logprobs: Int | None = Field(default=None, description="the number of top logprobs per token")
    best_of: Int | None = Field(
        default=None, description="only equal to n: rt returns every sample"
    )
    suffix: str | None = Field(default=None, description="not supported (no fill-in-the-middle)")


class ChatMessage(BaseModel):
    """A chat message: ``role`` and ``content`` text; other fields go to the chat template."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: str
    content: str | Annotated[list[Any], FAST] | None = None


class ChatCompletionRequest(OpenAISampling):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], FAST]
    max_completion_tokens: Int | None = None
    logprobs: bool | None = None
    top_logprobs: Int | None = None
    # Refused when set: rt has no tool calling or constrained decoding yet.
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None
    modalities: Strs | None = Field(default=None, description='only ["text"]')
    audio: Any = Field(default=None, description="not supported (no audio output)")
    web_search_options: Any = Field(default=None, description="not supported")
    # Accepted and ignored: a hint that changes nothing rt can honour (a prediction
    # only speeds OpenAI's answer up; the answer is the same)
    prediction: Any = None
    verbosity: Literal["low", "medium", "high"] | None = None
    # The chat template's variables (vLLM's and SGLang's extensions; a template
    # that does not read one is unchanged by it)
    chat_template_kwargs: Annotated[dict[str, Any], FAST] | None = Field(
        default=None, description='e.g. {"enable_thinking": false}; wins over the three below'
    )
    reasoning_effort: str | None = Field(
        default=None, description="the template's reasoning_effort variable"
    )
    add_generation_prompt: bool | None = Field(
        default=None, description="open the assistant's turn (default: true)"
    )
    continue_final_message: bool | None = Field(
        default=None, description="go on with the last message instead (default: false)"
    )


class AbortRequest(BaseModel):
    """``POST /abort_request``: one rid, or every request."""

    model_config = STRICT
    rid: str | None = ""
    abort_all: bool | None = None


class FlushCacheRequest(BaseModel):
    """``POST /flush_cache``'s body, if it has one: as SGLang's, no field."""

    model_config = STRICT


class ContinueRequest(BaseModel):
    """``POST /continue_generation``'s body, if it has one. SGLang's
    ``torch_empty_cache`` (give the allocator's cached blocks back before going
    on) asks for nothing here: rt's KV pool and buffers are allocated once."""

    model_config = STRICT
    torch_empty_cache: bool = True


class PauseRequest(BaseModel):
    """``POST /pause_generation``, as SGLang's: ``abort`` (its default) aborts every
    request in flight as it pauses; ``in_place`` holds them, their KV kept, until
    ``/continue_generation``; ``retract`` holds them too, their KV given back (a
    flush can drop it all; they compute it again after the continue)."""

    model_config = STRICT
    mode: Literal["abort", "retract", "in_place"] = "abort"


class WsFrame(BaseModel):
    """A WebSocket frame from the client: ``generate`` (with /generate's body,
    one prompt) or ``cancel``."""

    model_config = ConfigDict(extra="allow", strict=True)
    id: str | int
    type: Literal["generate", "cancel"]


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: a text, or a list of texts (SGLang's batch)."""

    model_config = STRICT
    model: str | None = None
    prompt: str | Strs | None = Field(default=None, description="the text (or texts)")
    text: str | Strs | None = Field(default=None, description="prompt's other name")
    add_special_tokens: bool = True
    return_token_strs: bool | None = Field(
        default=None, description="also each token as the vocabulary writes it (token_strs)"
    )
    messages: Any = Field(
        default=None, description="not supported: chat messages (send the rendered text)"
    )


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: token ids, or a list of lists of them."""

    model_config = STRICT
    model: str | None = None
    tokens: Ints | IntLists
    skip_special_tokens: bool | None = Field(
        default=None, description="SGLang's: leave special tokens out (default: keep them)"
    )


BODIES: dict[str, type[BaseModel]] = {
    "/generate": GenerateRequest,
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
    "/abort_request": AbortRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
    "/v1/tokenize": TokenizeRequest,
    "/v1/detokenize": DetokenizeRequest,
    "/pause_generation": PauseRequest,  # (optional: none is mode abort)
    "/flush_cache": FlushCacheRequest,  # (optional)
    "/continue_generation": ContinueRequest,  # (optional)
}
M = TypeVar("M", bound=BaseModel)
MAX_ITEMS = 1 << 16  # a list of texts, lists or objects (a batch, messages), at most


def loads(data: bytes | str) -> Any:
    """JSON, or a 400 that says why not. msgspec's parser first: ~5× faster (a
    10 MiB body held the event loop 0.15 s in the standard library's), and on
    standard JSON it gives the same values. What it refuses goes to the standard
    library's, whose answer stands: its error messages, and the values msgspec
    refuses (a lone surrogate escape, which the engine then refuses by name and
    position; NaN; a number past float's range; a UTF-8 BOM)."""
    try:
        with _no_gc():
            return msgspec.json.decode(data)
    except Exception:
        pass
    try:
        return json.loads(data)
    except RecursionError:
        raise HTTPError(400, "the body nests lists or objects too deeply") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        if "int_max_str_digits" in str(err):  # (its advice is for Python code: not the client's)
            limit = sys.get_int_max_str_digits()
            raise HTTPError(400, f"the body has an integer of more than {limit} digits") from None
        raise HTTPError(400, f"the body is not valid JSON: {err}") from None


def parse(model: type[M], data: bytes | str | dict[str, Any]) -> M:
    """``data`` as ``model``, or a 400 that names the field, says what was
    expected and what arrived."""
    with _no_gc():  # (many objects at once: its passes were most of a decode's time)
        return _parse(model, data)


def _parse(model: type[M], data: bytes | str | dict[str, Any]) -> M:
    obj = data if isinstance(data, dict) else loads(data)
    if not isinstance(obj, dict):
        raise HTTPError(400, f"the body must be a JSON object, got {_what(obj)}")
    obj = _prepared(model, obj, ())
    try:
        return model.model_validate(obj)
    except pydantic.ValidationError as err:
        message, param = _describe(err.errors(include_url=False), 0)
        raise HTTPError(400, message, param=param) from None


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Python's cyclic collector paused: decoding 16 MiB of empty lists took 0.85 s
    with it and 0.21 s without (each pass walks every object made so far). The
    objects of a request hold no cycles; the collector runs again after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _prepared(model: type[BaseModel], obj: dict[str, Any], at: tuple[Any, ...]) -> dict[str, Any]:
    """``obj`` as pydantic is to see it. A list of texts, lists or objects longer than
    ``MAX_ITEMS`` is refused here, and so is such a dict (pydantic builds an object per item: 1.5 s of the
    event loop and 268 MB for a 1 MiB list of empty objects); of the keys the model
    does not take, only the first is kept (pydantic reported each: 1.3 GiB for 16 MiB
    of them), so its first error, and the message, are what they were."""
    fields, out, extra = model.model_fields, obj, model.model_config.get("extra")
    if extra == "forbid":
        unknown = [k for k in obj if k not in fields]
        if unknown:
            idle = [k for k in unknown if asks_nothing(k, obj[k])]
            _note_ignored(model, at, idle)
            first = next((k for k in unknown if k not in idle), None)
            out = {k: v for k, v in obj.items() if k in fields or k == first}
    elif extra == "allow":  # (kept as they are: of any length)
        for name, value in out.items():
            if name not in fields and isinstance(value, list | dict):
                _check_length(value, (*at, name), False)
    for name, (inner, in_list, ids) in _inner_models(model).items():
        value = out.get(name)
        new = value
        if isinstance(value, list) or (isinstance(value, dict) and inner is None):
            _check_length(value, (*at, name), ids)
            if inner is not None and in_list:
                items = [
                    _prepared(inner, v, (*at, name, k)) if isinstance(v, dict) else v
                    for k, v in enumerate(value)
                ]
                new = items if any(x is not y for x, y in zip(items, value, strict=True)) else value
        elif isinstance(value, dict) and inner is not None:
            new = _prepared(inner, value, (*at, name))
        if new is not value:
            out = dict(out) if out is obj else out
            out[name] = new
    return out


# Fields of vLLM's and SGLang's that rt does not take, at the value that asks for
# nothing (besides null and false): a client that sends its defaults is served.
FOREIGN_DEFAULTS: dict[str, Any] = {
    "length_penalty": 1.0,  # vLLM's beam search, off
    "logprob_start_len": -1,  # SGLang's, in the OpenAI bodies
    "log_metrics": True,  # SGLang's /generate default
    "bad_words": [],  # vLLM's default
    "stop_regex": [],  # what sgl.gen sends (SGLang's RuntimeEndpoint)
    "separate_reasoning": True,  # SGLang's chat defaults: rt parses no reasoning out,
    "stream_reasoning": True,  # and these ask for nothing of a model that writes none
}
_IGNORED_NAMES_LOGGED = 256  # a bound on the names logged (a client may send many)
_NAME_SHOWN = 64  # a longer field name is shown cut (show())
_ignored_logged: set[str] = set()


def asks_nothing(name: str, value: Any) -> bool:
    """An unknown field's value that asks for nothing: left out, not refused."""
    if value is None or value is False:  # (not {} or []: vLLM's guided_json {} asks for JSON)
        return True
    default = FOREIGN_DEFAULTS.get(name, _ABSENT)
    if type(default) in (int, float):  # (true is no number here, though Python's 1)
        return type(value) in (int, float) and value == default
    return type(value) is type(default) and bool(value == default)  # (nor is 1 true)


_ABSENT = object()


def _note_ignored(model: type[BaseModel], at: tuple[Any, ...], names: list[str]) -> None:
    """A log line the first time each field is left out (as vLLM logs each request's)."""
    for name in names:
        where = _path((*at, name))
        key = f"{model.__name__}.{where}"
        if key not in _ignored_logged and len(_ignored_logged) < _IGNORED_NAMES_LOGGED:
            _ignored_logged.add(key)
            log.info(
                "%s: field %s is not rt's and asks for nothing: ignored", model.__name__, where
            )


def _check_length(value: list[Any] | dict[str, Any], at: tuple[Any, ...], ids: bool) -> None:
    """A list or a dict has at most MAX_ITEMS items (a batch, messages, content parts,
    ``logit_bias``: pydantic took 0.55 s of the event loop for a 16 MiB dict), but for
    a list of token ids where the field takes one (``ids``): cheap to check, and a
    prompt's length (one whose first item is no number fails there)."""
    if len(value) > MAX_ITEMS and not (
        ids and isinstance(value, list) and isinstance(value[0], int)
    ):
        where = _path(at)
        raise HTTPError(
            400, f"{where}: expected at most {MAX_ITEMS} items, got {len(value)}", param=where
        )


# the fields whose lists of token ids are prompts, bounded by the context (or by
# /detokenize's own limit), not by MAX_ITEMS; stop_token_ids is not one (7.8M ids of
# it held the event loop a second, and 1 GB a request)
ID_FIELDS = frozenset({"input_ids", "prompt", "tokens"})


@functools.cache
def _inner_models(model: type[BaseModel]) -> dict[str, tuple[type[BaseModel] | None, bool, bool]]:
    """Each field of ``model``: the model its value is, or lists items of (None if
    neither), whether a list of them is among what it takes, and whether a list of
    token ids (ints) is."""
    out: dict[str, tuple[type[BaseModel] | None, bool, bool]] = {}
    for name, info in model.model_fields.items():
        todo: list[tuple[Any, bool]] = [(info.annotation, False)]
        found: type[BaseModel] | None = None
        in_list = ids = False
        while todo:
            kind, listed = todo.pop()
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                found, in_list = found or kind, in_list or listed
            else:
                inside = typing.get_origin(kind) is list
                ids = ids or (inside and typing.get_args(kind) == (int,) and name in ID_FIELDS)
                todo.extend((arg, listed or inside) for arg in typing.get_args(kind))
        out[name] = (found, in_list, ids)
    return out


def _describe(errors: list[Any], start: int) -> tuple[str, str | None]:
    first = errors[0]
    loc = first["loc"]
    tag_at = next((i for i in range(start, len(loc)) if _is_tag(loc[i])), None)
    if tag_at is not None:
        prefix = loc[:tag_at]
        alternatives = [
            e
            for e in errors
            if e["loc"][:tag_at] == prefix and len(e["loc"]) > tag_at and _is_tag(e["loc"][tag_at])
        ]
        deeper = [e for e in alternatives if len(e["loc"]) > tag_at + 1]
        if deeper and len({e["loc"][tag_at] for e in deeper}) == 1:
            # The value had the right shape for one alternative only: say what is wrong inside.
            return _describe(deeper, tag_at + 1)
        expected = list(dict.fromkeys(str(e["loc"][tag_at]) for e in alternatives))
        whole = next(
            (e.get("input") for e in alternatives if len(e["loc"]) == tag_at + 1),
            first.get("input"),
        )
        param = _path(prefix)
        return f"{param}: expected {' or '.join(expected)}; got {_what(whole)}", param
    param = _path(loc)
    if first["type"] == "extra_forbidden":
        return f"{param}: unknown field (got {_what(first.get('input'))})", param
    if first["type"] == "missing":
        return f"{param}: this field is required", param
    msg = first["msg"]
    return f"{param}: {msg[:1].lower()}{msg[1:]} (got {_what(first.get('input'))})", param


_MODELS = {"SamplingParams", "StreamOptions", "ChatMessage"}


def _is_tag(part: Any) -> bool:
    """A union alternative's name in an error's location (pydantic puts it there)."""
    return isinstance(part, str) and (
        part in ("str", "int", "float", "bool") or part in _MODELS or "[" in part
    )


def _path(parts: tuple[Any, ...]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_tag(part):
            part = _name(part)
            out += f".{part}" if out else part
    return out or "body"


def _name(name: str) -> str:
    """A client's field name as a message or log line shows it: as it is, or
    quoted, escaped and cut when it holds a line break (it forged a log line) or
    is long (a 4 MiB name took 4 MiB of the log)."""
    return name if name.isprintable() and len(name) <= _NAME_SHOWN else show(name)


def _what(value: Any) -> str:
    if value is None or isinstance(value, bool | int | float | str):
        return show(value)
    return f"{type(value).__name__} {show(value)}"

"""From the Python API's arguments to a GenerateRequest, and from a finished
record to a GenerateOutput.

Nothing a caller sends may stop the engine, so every argument is checked here,
before anything is sent: a bad one is an InvalidRequestError that names it
(with its position inside a list or a string), says what was expected and what
arrived. Past these checks the tokenizer can encode every string, the request
crosses the rings as MessagePack (never the codec's pickle fallback) and every
number fits the tensor it goes into.

Refused (where SGLang's and vLLM's servers answer 400):

* text that is not valid Unicode: a lone surrogate such as ``"\\ud800"``, which
  a JSON string can carry as an escape but no tokenizer can encode, in the
  prompt, a chat message or a stop string;
* a value of the wrong type: a bool where a number goes, a float where an
  integer goes (``n=2.0``), a number where a bool goes, None for a number or a
  bool; an integer past 64 bits; NaN or infinity; a number out of range
  (past float32's largest too: the sampler computes in float32);
* token ids outside the vocabulary (the prompt, stop_token_ids, logit_bias,
  allowed_token_ids), and an empty ``allowed_token_ids`` (nothing could be drawn);
* more prompt ids than the context length (ContextOverflowError) without
  ``allow_auto_truncate``; with it, the ids before the last context length's
  worth are cut here (the tokenizer then cuts to the room ``max_new_tokens``
  leaves, and ``truncated_tokens`` counts both). ``truncate_prompt_tokens``
  (vLLM's) asks for it per request: k keeps the prompt's last k tokens (ids are
  cut here, text once tokenized), -1 is ``allow_auto_truncate``;
* a prompt given as an empty list of ids or of messages (text may be empty:
  the tokenizer may add a BOS token, and says so if it does not);
* chat messages that are not objects with a string ``role`` and a
  ``content`` that is a string or a list of text parts (other parts and
  ``content=None`` are not supported yet), or
  whose other fields are not JSON values (string keys, finite numbers, at most
  ``MAX_JSON_DEPTH`` levels);
* ``chat_template_kwargs`` without a chat prompt, not an object of JSON values,
  or setting what the tokenizer sets (``tokenize``, ``tools``, …);
* stop strings that are empty, more than ``MAX_STOP_STRINGS``, or longer than
  ``MAX_STOP_CHARS`` (matching holds text back as long as a stop string, and
  each costs the detokenizer a step a character of every sample);
* an unknown parameter.

Repaired, where what the caller meant is not in doubt:

* an integer where a float goes becomes that float (JSON has one number type);
* a decimal string key of ``logit_bias`` (a JSON object's keys are strings)
  becomes that token id;
* one stop string becomes a list of one;
* ``max_new_tokens=None`` means as many as the context leaves room for after
  the prompt (OpenAI's chat default; the tokenizer sets it);
* None means "not given" for ``seed`` (one is drawn), ``stop``,
  ``stop_token_ids``, ``logit_bias``, ``allowed_token_ids`` and ``rid``.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from rt.detok.incremental import DetokParams
from rt.errors import ContextOverflowError, InvalidRequestError, no_room_for_prompt
from rt.frontend.chat import (
    chat_messages,
    check_unicode,
    described,
    template_kwargs,
)
from rt.frontend.table import Record
from rt.gpu.sampling_params import INT64_MAX, INT64_MIN, SEED_MASK, SamplingParams, show
from rt.messages import ChatMessage, GenerateRequest
from rt.outputs import Completion, GenerateOutput, Meta
from rt.shm import codec

SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
FLOAT_FIELDS = {f.name for f in dataclasses.fields(SamplingParams) if f.type in ("float", float)}
OTHER_FIELDS = {
    "input_ids",
    "messages",
    "chat_template_kwargs",
    "stop",
    "no_stop_trim",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "allow_auto_truncate",
    "truncate_prompt_tokens",
    "add_special_tokens",
    "priority",
    "rid",
}
MAX_CONTEXT = 1 << 31  # max_new_tokens=None's bound where the context length is not known
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_RID_CHARS = 1024
PROMPT_KINDS = {
    "prompt": "text, a list of token ids or a list of chat messages",
    "input_ids": "a list of token ids",
    "messages": "a list of chat messages",
}


def build_request(
    prompt: Any,
    options: Mapping[str, Any],
    vocab_size: int,
    context_length: int | None = None,
    policy: str = "priority",
    max_logprobs: int | None = None,
) -> GenerateRequest:
    """``prompt`` is text, a list of token ids, or a list of chat messages (or None
    with ``input_ids=`` / ``messages=``); the other options are sampling parameters,
    ``stop`` strings, detokenizer options, ``priority``, ``allow_auto_truncate``
    and ``rid``. Raises InvalidRequestError for anything the engine could not
    serve (the module's docstring lists what is refused and what is repaired).
    Ids past ``context_length`` are refused (ContextOverflowError) or, with
    ``allow_auto_truncate``, cut here, before their ids are checked one by one
    and sent: a prompt of millions of ids held the event loop for a second.
    A ``priority`` other than 0 is refused unless the scheduling ``policy`` is
    "priority" (as vLLM refuses it: no order would honour it). ``top_logprobs``
    past ``max_logprobs`` is refused (the engine's option, vLLM's: each is a
    (token, logprob) pair the frontend holds per token of every sample)."""
    unknown = [k for k in options if k not in SAMPLING_FIELDS and k not in OTHER_FIELDS]
    if unknown:
        raise InvalidRequestError(
            f"unknown parameter(s) {', '.join(sorted(map(show, unknown)))}; expected sampling parameters "
            f"{sorted(SAMPLING_FIELDS)} or {sorted(OTHER_FIELDS)}"
        )
    truncate = _flag(options, "allow_auto_truncate", False)
    keep_last = _keep_last(options.get("truncate_prompt_tokens"), context_length)
    if keep_last < 0:  # -1: to the context, as allow_auto_truncate
        truncate, keep_last = True, 0
    overflow = None  # raised once the other arguments are checked: a bad one is named first
    try:
        text, input_ids, messages, cut = _prompt(
            prompt, options, vocab_size, context_length, truncate, keep_last
        )
    except ContextOverflowError as err:
        overflow, (text, input_ids, messages, cut) = err, (None, None, None, 0)
    to_context = "max_new_tokens" in options and options["max_new_tokens"] is None
    if to_context:  # checked against the most the context allows; the tokenizer sets it
        options = {**options, "max_new_tokens": context_length or MAX_CONTEXT}
    sampling = _sampling(options, vocab_size)
    if max_logprobs is not None and sampling.top_logprobs > max_logprobs:
        raise InvalidRequestError(
            f"top_logprobs: expected at most {max_logprobs} (the server's max_logprobs), "
            f"got {sampling.top_logprobs}"
        )
    # taken as vLLM and SGLang take it, and without effect, as theirs with a fast tokenizer
    _flag(options, "spaces_between_special_tokens", True)
    detok = DetokParams(
        _flag(options, "skip_special_tokens", True),
        _stop(options.get("stop")),
        _flag(options, "no_stop_trim", False),
        sampling.min_new_tokens,
    )
    rid = options.get("rid")
    if rid is not None:
        if not isinstance(rid, str):
            raise InvalidRequestError(f"rid: expected a string, got {described(rid)}")
        check_unicode("rid", rid)
        if len(rid) > MAX_RID_CHARS:  # (every output of the request repeats it)
            raise InvalidRequestError(
                f"rid: expected at most {MAX_RID_CHARS} characters, got {len(rid)}"
            )
    priority = options.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidRequestError(f"priority: expected an integer, got {show(priority)}")
    if not INT64_MIN <= priority <= INT64_MAX:
        raise InvalidRequestError(
            f"priority: expected an integer in [{INT64_MIN}, {INT64_MAX}], got {show(priority)}"
        )
    if priority and policy != "priority":
        raise InvalidRequestError(
            f"priority: the schedule policy is {policy!r}, which has no priorities; expected 0 "
            f"or none, got {priority} (schedule_policy='priority', or rt-serve's "
            "--schedule-policy priority, uses them)"
        )
    template = template_kwargs(options.get("chat_template_kwargs"), messages is not None)
    add_special = options.get("add_special_tokens")
    if add_special is not None and not isinstance(add_special, bool):
        raise InvalidRequestError(
            f"add_special_tokens: expected true, false or none, got {show(add_special)}"
        )
    if overflow is not None:
        if not to_context and context_length and sampling.max_new_tokens >= context_length > 1:
            # (the fault is max_new_tokens', which no cut of the prompt can help)
            raise ContextOverflowError(no_room_for_prompt(sampling.max_new_tokens, context_length))
        raise overflow
    return _as_received(
        GenerateRequest(
            rid=rid or uuid.uuid4().hex,
            text=text,
            input_ids=input_ids,
            messages=messages,
            sampling=sampling,
            detok=detok,
            allow_auto_truncate=truncate,
            priority=priority,
            truncated=cut,
            keep_last=keep_last,
            to_context=to_context,
            template_kwargs=template,
            add_special_tokens=add_special,
        )
    )


# ---- the prompt -------------------------------------------------------------------


def _keep_last(value: Any, context_length: int | None) -> int:
    """``truncate_prompt_tokens``: 0 (not given), -1 (to the context) or k >= 1,
    at most the context length (as vLLM's: more is no truncation)."""
    if value is None:
        return 0
    limit = f" and at most the context length ({context_length})" if context_length else ""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (value == -1 or 1 <= value <= (context_length or INT64_MAX))
    ):
        raise InvalidRequestError(
            f"truncate_prompt_tokens: expected a number of tokens >= 1{limit} (the prompt's "
            f"last are kept) or -1 (cut to the context), got {show(value)}"
        )
    return value


def _prompt(
    prompt: Any,
    options: Mapping[str, Any],
    vocab_size: int,
    context_length: int | None,
    truncate: bool,
    keep_last: int = 0,
) -> tuple[str | None, tuple[int, ...] | None, tuple[ChatMessage, ...] | None, int]:
    """The prompt in its one form, and how many ids were cut from its start."""
    given = {
        "prompt": prompt,
        "input_ids": options.get("input_ids"),
        "messages": options.get("messages"),
    }
    present = [k for k, v in given.items() if v is not None]
    if len(present) != 1:
        raise InvalidRequestError(
            f"expected exactly one of a prompt, input_ids= or messages=; got {present or 'none'}"
        )
    name = present[0]
    value = given[name]
    if isinstance(value, str):
        if name != "prompt":
            raise InvalidRequestError(f"{name}: expected {PROMPT_KINDS[name]}, got a string")
        check_unicode("prompt", value)
        return value, None, None, 0
    if not isinstance(value, Sequence) or isinstance(value, bytes | bytearray):
        raise InvalidRequestError(f"{name}: expected {PROMPT_KINDS[name]}, got {described(value)}")
    if not value:
        raise InvalidRequestError(f"{name}: expected {PROMPT_KINDS[name]}, got an empty list")
    if name == "messages" or (name == "prompt" and isinstance(value[0], Mapping)):
        return None, None, chat_messages(name, value), 0
    cut = max(len(value) - keep_last, 0) if keep_last else 0
    value = value[cut:]
    if context_length is not None and len(value) > context_length:
        if not truncate:
            raise ContextOverflowError(
                f"the prompt has {len(value)} tokens, more than the context length "
                f"{context_length}; shorten the prompt or set allow_auto_truncate"
            )
        cut += len(value) - context_length  # the end stays, as the tokenizer's cut keeps it
        value = value[-context_length:]
    return None, _token_ids(name, value, vocab_size, cut), None, cut


def _token_ids(name: str, ids: Sequence[Any], vocab_size: int, start: int) -> tuple[int, ...]:
    """``ids`` checked; ``start``: the position of the first in the caller's list."""
    for i, tok in enumerate(ids, start):
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < vocab_size:
            raise InvalidRequestError(
                f"{name}[{i}]: expected a token id in [0, {vocab_size}), got {show(tok)}"
            )
    return tuple(ids)


# ---- sampling, stop strings, flags ---------------------------------------------------


def _sampling(options: Mapping[str, Any], vocab_size: int) -> SamplingParams:
    kw = {k: v for k, v in options.items() if k in SAMPLING_FIELDS}
    if "stop_token_ids" in kw:
        kw["stop_token_ids"] = _id_list("stop_token_ids", kw["stop_token_ids"])
    if "logit_bias" in kw:
        kw["logit_bias"] = _logit_bias(kw["logit_bias"])
    if kw.get("allowed_token_ids") is not None:
        kw["allowed_token_ids"] = _id_list("allowed_token_ids", kw["allowed_token_ids"])
    if kw.get("seed") is None:
        # Every request gets a seed here, so its tokens are a pure function of
        # (seed, request, position) even when a crashed scheduler resubmits it.
        kw["seed"] = secrets.randbits(63) & SEED_MASK
    sampling = SamplingParams(**kw)
    sampling.validate(vocab_size)
    # JSON has one number type: an integer where a float goes is that float (an
    # int past int64 in a float field would otherwise reach torch as an int).
    repaired: dict[str, Any] = {k: float(kw[k]) for k in FLOAT_FIELDS if k in kw}
    repaired["logit_bias"] = {tok: float(bias) for tok, bias in sampling.logit_bias.items()}
    return dataclasses.replace(sampling, **repaired)


def _id_list(name: str, value: Any) -> tuple[Any, ...]:
    """The ids are checked by SamplingParams.validate; this checks the list."""
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str | bytes | bytearray):
        raise InvalidRequestError(f"{name}: expected a list of token ids, got {described(value)}")
    try:  # each id once (by type too: True == 1 must still be refused by validate)
        return tuple(v for _, v in dict.fromkeys((type(v), v) for v in value))
    except TypeError:  # an unhashable element: validate names it
        return tuple(value)


_DECIMAL = re.compile(r"[0-9]{1,19}")


def _logit_bias(value: Any) -> dict[Any, Any]:
    """Token ids as keys: ints, or decimal strings (a JSON object's keys)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidRequestError(
            f"logit_bias: expected an object mapping token ids to biases, got {described(value)}"
        )
    out: dict[Any, Any] = {}
    for key, bias in value.items():
        tok = int(key) if isinstance(key, str) and _DECIMAL.fullmatch(key) else key
        if isinstance(tok, bool) or not isinstance(tok, int):
            raise InvalidRequestError(
                f"logit_bias: expected token ids (integers, or decimal strings) as keys, "
                f"got {show(key)}"
            )
        if tok in out:
            raise InvalidRequestError(f"logit_bias: token id {tok} appears twice")
        out[tok] = bias
    return out


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = (value,) if isinstance(value, str) else value
    if not isinstance(stops, Sequence) or isinstance(stops, bytes | bytearray):
        raise InvalidRequestError(
            f"stop: expected a string or a list of strings, got {described(value)}"
        )
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequestError(
            f"stop: expected at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}"
        )
    for i, stop in enumerate(stops):
        where = "stop" if isinstance(value, str) else f"stop[{i}]"
        if not isinstance(stop, str) or not stop:
            raise InvalidRequestError(
                f"{where}: expected a non-empty string, got {described(stop)}"
            )
        if len(stop) > MAX_STOP_CHARS:
            raise InvalidRequestError(
                f"{where}: expected at most {MAX_STOP_CHARS} characters, got {len(stop)}"
            )
        check_unicode(where, stop)
    return tuple(stops)


def _flag(options: Mapping[str, Any], name: str, default: bool) -> bool:
    value = options.get(name, default)
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{name}: expected true or false, got {show(value)}")
    return value


# ---- the codec check ------------------------------------------------------------------


def _as_received(req: GenerateRequest) -> GenerateRequest:
    """``req`` as the tokenizer will read it. Encoded as MessagePack here, not by
    ``codec.dumps``: its pickle fallback would carry a value the tokenizer
    cannot use. The checks above leave nothing for this to find; it is the
    net under them."""
    try:
        data = msgspec.msgpack.encode(req, enc_hook=_plain)
    except (TypeError, ValueError, OverflowError, RecursionError, NotImplementedError) as err:
        raise InvalidRequestError(f"the request cannot be sent: {err}") from err
    try:
        received: GenerateRequest = codec.loads(data)
    except ValueError as err:  # msgspec.ValidationError: a field of the wrong type
        raise InvalidRequestError(f"a parameter has the wrong type: {_named(err)}") from err
    return received


def _plain(value: Any) -> Any:
    """A subclass of str, int or float, or a mapping that is no dict (a UserDict, a
    MappingProxyType), all of which the checks above accept, as the plain value,
    without calling what a subclass of str, int or float may override."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return dict(value.items())
    raise NotImplementedError(f"Encoding objects of type {type(value).__name__} is unsupported")


def _named(err: ValueError) -> str:
    """msgspec's path into the request (an array: the tag, then the fields)
    with the field's name: ``$[4][0]`` becomes ``messages[0]``."""
    fields = GenerateRequest.__struct_fields__

    def name(match: re.Match[str]) -> str:
        index = int(match.group(1)) - 1
        return fields[index] if 0 <= index < len(fields) else match.group(0)

    return re.sub(r"\$\[(\d+)\]", name, str(err))


# ---- the output -------------------------------------------------------------------------


def finished_output(record: Record) -> GenerateOutput:
    choices = tuple(
        Completion(
            index=i,
            text=seq.text,
            output_ids=tuple(seq.output_ids),
            finish_reason=seq.finish_reason,
            matched_stop=seq.matched_stop,
            logprobs=tuple(seq.logprobs) if record.req.sampling.logprobs else None,
            top_logprobs=tuple(tuple(t) for t in seq.top_logprobs)
            if record.req.sampling.top_logprobs
            else None,
            resumed_from=tuple(seq.resumed_from),
        )
        for i, seq in enumerate(record.seqs)
    )
    return GenerateOutput(
        rid=record.user_rid,
        text=choices[0].text,
        output_ids=choices[0].output_ids,
        finish_reason=choices[0].finish_reason,
        matched_stop=choices[0].matched_stop,
        meta=record_meta(record),
        choices=choices,
        logprobs=choices[0].logprobs,
        top_logprobs=choices[0].top_logprobs,
        prompt_ids=prompt_ids(record),
        prompt_logprobs=record.prompt_logprobs,
        prompt_top_logprobs=record.prompt_top_logprobs,
    )


def prompt_ids(record: Record) -> tuple[int, ...] | None:
    """The prompt's ids, for a request that asked for the prompt's logprobs."""
    if record.prompt_logprobs is None or record.input_ids is None:
        return None
    return tuple(int(t) for t in record.input_ids)


def record_meta(record: Record) -> Meta:
    """A request's counts and timings (seconds from its arrival), as far as they go."""
    done = record.finished_at
    return Meta(
        prompt_tokens=record.prompt_tokens,
        completion_tokens=sum(len(s.output_ids) for s in record.seqs),
        cached_tokens=record.cached_tokens,
        seed=record.req.sampling.seed,
        truncated_tokens=record.truncated,
        time_to_first_token=record.first_token_at - record.created
        if record.first_token_at is not None
        else None,
        latency=done - record.created if done is not None else None,
        queue_time=max(0.0, record.admitted_at - record.created)
        if record.admitted_at is not None
        else None,
    )

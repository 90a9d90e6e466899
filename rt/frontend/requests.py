"""From the Python API's arguments to a GenerateRequest, and from a finished
record to a GenerateOutput. Bad arguments are refused here, before anything
is sent: an InvalidRequestError that names the argument."""

from __future__ import annotations

import dataclasses
import re
import secrets
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from rt.detok.incremental import DetokParams
from rt.errors import InvalidRequestError
from rt.frontend.table import Record
from rt.gpu.sampling_params import SEED_MASK, SamplingParams
from rt.messages import GenerateRequest
from rt.outputs import Completion, GenerateOutput, Meta
from rt.shm import codec

SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
OTHER_FIELDS = {
    "input_ids",
    "messages",
    "stop",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "allow_auto_truncate",
    "priority",
    "rid",
}


def build_request(prompt: Any, options: Mapping[str, Any], vocab_size: int) -> GenerateRequest:
    """``prompt`` is text, a list of token ids, or a list of chat messages (or None
    with ``input_ids=`` / ``messages=``); the other options are sampling parameters,
    ``stop`` strings, detokenizer options, ``priority``, ``allow_auto_truncate``."""
    unknown = set(options) - SAMPLING_FIELDS - OTHER_FIELDS
    if unknown:
        raise InvalidRequestError(
            f"unknown parameter(s) {sorted(unknown)}; expected sampling parameters "
            f"{sorted(SAMPLING_FIELDS)} or {sorted(OTHER_FIELDS)}"
        )
    text, input_ids, messages = _prompt(prompt, options)
    sampling_kw = {k: v for k, v in options.items() if k in SAMPLING_FIELDS}
    if "stop_token_ids" in sampling_kw:
        sampling_kw["stop_token_ids"] = tuple(sampling_kw["stop_token_ids"] or ())
    if sampling_kw.get("logit_bias"):
        sampling_kw["logit_bias"] = {int(k): v for k, v in sampling_kw["logit_bias"].items()}
    if sampling_kw.get("seed") is None:
        # Every request gets a seed here, so its tokens are a pure function of
        # (seed, request, position) even when a crashed scheduler resubmits it.
        sampling_kw["seed"] = secrets.randbits(63) & SEED_MASK
    try:
        sampling = SamplingParams(**sampling_kw)
    except TypeError as err:
        raise InvalidRequestError(f"sampling parameters: {err}") from err
    sampling.validate(vocab_size)
    stop = options.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) and s for s in stop):
        raise InvalidRequestError(f"stop: expected non-empty strings, got {stop!r}")
    rid = options.get("rid") or uuid.uuid4().hex
    if not isinstance(rid, str):
        raise InvalidRequestError(f"rid: expected a string, got {rid!r}")
    priority = options.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidRequestError(f"priority: expected an integer, got {priority!r}")
    req = GenerateRequest(
        rid=rid,
        text=text,
        input_ids=input_ids,
        messages=messages,
        sampling=sampling,
        detok=DetokParams(
            bool(options.get("skip_special_tokens", True)),
            bool(options.get("spaces_between_special_tokens", True)),
            stop,
        ),
        allow_auto_truncate=bool(options.get("allow_auto_truncate", False)),
        priority=priority,
    )
    try:  # what the tokenizer will read: a value of the wrong type fails here, not there
        received: GenerateRequest = codec.as_received(req)
    except ValueError as err:
        raise InvalidRequestError(f"a parameter has the wrong type: {_named(err)}") from err
    return received


def _named(err: ValueError) -> str:
    """msgspec's path into the request (an array: the tag, then the fields)
    with the field's name: ``$[4][0]`` becomes ``messages[0]``."""
    fields = GenerateRequest.__struct_fields__

    def name(match: re.Match[str]) -> str:
        index = int(match.group(1)) - 1
        return fields[index] if 0 <= index < len(fields) else match.group(0)

    return re.sub(r"\$\[(\d+)\]", name, str(err))


def _prompt(prompt: Any, options: Mapping[str, Any]) -> tuple[Any, Any, Any]:
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
    value = given[present[0]]
    if isinstance(value, str):
        if present[0] != "prompt":
            raise InvalidRequestError(f"{present[0]}: expected a list, got a string")
        return value, None, None
    if not isinstance(value, Sequence) or isinstance(value, bytes):
        raise InvalidRequestError(
            f"prompt: expected text, a list of token ids or a list of messages, got {type(value).__name__}"
        )
    if present[0] != "messages" and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        return None, tuple(value), None
    if present[0] != "input_ids" and all(isinstance(m, dict) for m in value):
        return None, None, tuple(dict(m) for m in value)
    raise InvalidRequestError(
        f"{present[0]}: expected a list of token ids (ints) or of chat messages (objects), "
        f"got {list(value)[:3]!r}…"
    )


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
        )
        for i, seq in enumerate(record.seqs)
    )
    first = choices[0]
    done = record.finished_at
    meta = Meta(
        prompt_tokens=record.prompt_tokens,
        completion_tokens=sum(len(c.output_ids) for c in choices),
        cached_tokens=record.cached_tokens,
        seed=record.req.sampling.seed,
        truncated_tokens=record.truncated,
        time_to_first_token=record.first_token_at - record.created
        if record.first_token_at is not None
        else None,
        latency=done - record.created if done is not None else None,
    )
    return GenerateOutput(
        rid=record.rid,
        text=first.text,
        output_ids=first.output_ids,
        finish_reason=first.finish_reason,
        matched_stop=first.matched_stop,
        meta=meta,
        choices=choices,
        logprobs=first.logprobs,
        top_logprobs=first.top_logprobs,
    )

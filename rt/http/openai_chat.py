"""The OpenAI API's ``/v1/chat/completions``: the chat template's variables, the
messages, the answer and its stream (see :mod:`rt.http.openai_api`)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from rt.gpu.sampling_params import show
from rt.http import sse
from rt.http.asgi import Exchange, HTTPError
from rt.http.engine_port import Delta
from rt.http.front import PROMPT, Front
from rt.http.generation import Job, Result, Seq, run
from rt.http.openai_api import (
    choice_finish,
    engine_options,
    prompt_jobs,
    rid_field,
    served_name,
    stop_reason,
)
from rt.http.openai_format import ChunkUsage, chat_logprobs, prompt_token_ids, token_ids, usage
from rt.http.schemas import ChatCompletionRequest


def _message(message: Any) -> dict[str, Any]:
    """A chat message for the engine: a field set to null is not there, but for
    ``content`` (refused by name: rt has no tool calls to stand in for it)."""
    given = {name: getattr(message, name) for name in type(message).model_fields}
    given.update(message.model_extra or {})  # (shallow: model_dump copied every value
    out = {k: v for k, v in given.items() if v is not None}  # of a 15 MiB content: 3 s)
    if "content" not in out and "content" in message.model_fields_set:
        out["content"] = None
    return out


def template_variables(req: ChatCompletionRequest) -> dict[str, Any] | None:
    """The chat template's variables, as vLLM gives them: ``add_generation_prompt``,
    ``continue_final_message`` and ``reasoning_effort`` from the body's fields,
    then ``chat_template_kwargs``, which wins (the engine checks them all)."""
    given = {
        name: getattr(req, name)
        for name in ("add_generation_prompt", "continue_final_message", "reasoning_effort")
        if getattr(req, name) is not None
    }
    if req.chat_template_kwargs is None and not given:
        return None
    merged = {**given, **(req.chat_template_kwargs or {})}
    kwargs = req.chat_template_kwargs or {}
    if merged.get("continue_final_message") is True and merged.get("add_generation_prompt") is True:
        # (named where the body sets them: the engine's message names chat_template_kwargs)
        name = next(
            (f for f in ("continue_final_message", "add_generation_prompt") if f not in kwargs),
            "chat_template_kwargs",
        )
        raise HTTPError(
            400,
            f"{name}: continue_final_message goes on with the last message, "
            "add_generation_prompt starts a new one; expected at most one of them true",
            param=name,
        )
    return merged


async def chat_completions(front: Front, ex: Exchange, body: bytes) -> None:
    req = await front.parse(ChatCompletionRequest, body)
    # no tools, or none to call (tool_choice "none": the tools are left out of the
    # prompt, as vLLM's --exclude-tools-when-tool-choice-none does)
    idle = req.tool_choice == "none" or (req.tool_choice is None and not req.tools)
    if req.tools == [] and req.tool_choice in ("auto", "required"):
        idle = True  # an empty list of tools: none to call, as vLLM takes it
    if req.tools is not None and not isinstance(req.tools, list):
        raise HTTPError(
            400, f"tools: expected a list of tools, got {show(req.tools)}", param="tools"
        )
    for name in ("tools", "tool_choice", "functions", "function_call"):
        value = getattr(req, name)
        if value not in (None, [], "none") and not (name in ("tools", "tool_choice") and idle):
            raise HTTPError(
                400,
                f"{name}: not supported (rt has no tool calling yet); tool_choice 'none' "
                "with tools is served, without them",
                param=name,
            )
    for name, what in (("audio", "audio output"), ("web_search_options", "web search")):
        if getattr(req, name) is not None:
            raise HTTPError(400, f"{name}: not supported (rt has no {what})", param=name)
    if req.modalities is not None and req.modalities != ["text"]:
        raise HTTPError(
            400,
            f"modalities: only ['text'] is supported, got {show(req.modalities)}",
            param="modalities",
        )
    if req.top_logprobs and not req.logprobs:  # (0, vLLM's default, asks for nothing)
        raise HTTPError(400, "top_logprobs: only with logprobs=true", param="top_logprobs")
    as_ids = bool(req.return_tokens_as_token_ids)
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    options = engine_options(front, req, max_tokens)
    options.setdefault("max_new_tokens", None)  # as OpenAI: the room the prompt leaves
    options["messages"] = [_message(m) for m in req.messages]
    variables = template_variables(req)
    if variables is not None:
        options["chat_template_kwargs"] = variables
    if req.logprobs:
        options["logprobs"] = True
        options["top_logprobs"] = req.top_logprobs or 0
        await front.tokens.ensure()
    cid = f"chatcmpl-{req.rid or uuid.uuid4().hex}"
    jobs = prompt_jobs([None], options, req.rid or cid)
    limit_name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    rename = {"max_new_tokens": limit_name, "min_new_tokens": "min_tokens", PROMPT: "messages"}
    rename["rid"] = rid_field(req)
    head = {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": served_name(front),
    }
    if req.stream:
        await _stream_chat(
            front, ex, req, jobs, {**head, "object": "chat.completion.chunk"}, rename
        )
        return
    async with ex.cancel_on_disconnect():
        results = await run(front, jobs, rename=rename)
    if ex.disconnected:
        return
    result = results[0]
    choices = [
        {
            "index": j,
            "message": {"role": "assistant", "content": seq.text},
            "logprobs": chat_logprobs(front, seq.output_ids, seq.logprobs, seq.top_logprobs, as_ids)
            if req.logprobs
            else None,
            "finish_reason": choice_finish(seq, result),
            "matched_stop": seq.matched_stop,
            "stop_reason": stop_reason(front, req, seq),
            **token_ids(req.return_token_ids, seq.output_ids),
        }
        for j, seq in enumerate(result.seqs)
    ]
    prompt = prompt_token_ids(req.return_token_ids, result)
    await ex.json({**head, "choices": choices, "usage": usage(results), **prompt})


async def _stream_chat(
    front: Front,
    ex: Exchange,
    req: ChatCompletionRequest,
    jobs: list[Job],
    head: dict[str, Any],
    rename: dict[str, str],
) -> None:
    started: set[int] = set()
    extra = ChunkUsage(req.stream_options)
    as_ids = bool(req.return_tokens_as_token_ids)

    def opening(j: int, result: Result) -> list[Any]:
        """A choice's first chunk: its role alone, as OpenAI's and vLLM's."""
        if j in started:
            return []
        # (the stream's first chunk has the prompt's ids, when asked: vLLM's)
        prompt = prompt_token_ids(req.return_token_ids, result) if not started else {}
        started.add(j)
        choice = {"index": j, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
        none = {"finish_reason": None, "matched_stop": None, "stop_reason": None}
        none |= token_ids(req.return_token_ids, ())
        return [{**head, "choices": [choice | none], **extra(result, Seq()), **prompt}]

    def events_of(i: int, delta: Delta, result: Result) -> list[Any]:
        events = opening(delta.index, result)
        message: dict[str, Any] = {"content": delta.text}
        logprobs = None
        if req.logprobs:
            logprobs = chat_logprobs(
                front, delta.output_ids, delta.logprobs or (), delta.top_logprobs or (), as_ids
            )
        seq = result.seqs[delta.index]
        choice = {
            "index": delta.index,
            "delta": message,
            "logprobs": logprobs,
            "finish_reason": delta.finish_reason,
            "matched_stop": seq.matched_stop if delta.finish_reason else None,
            "stop_reason": stop_reason(front, req, seq) if delta.finish_reason else None,
            **token_ids(req.return_token_ids, delta.output_ids),
        }
        return [*events, {**head, "choices": [choice], **extra(result, seq)}]

    def tail_of(results: list[Result]) -> list[Any]:
        result = results[0]
        events: list[Any] = []
        for j, seq in enumerate(result.seqs):
            if seq.finish_reason is None and result.aborted:
                choice = {"index": j, "delta": {}, "logprobs": None, "finish_reason": "abort"}
                choice |= token_ids(req.return_token_ids, ())
                events += opening(j, result)
                events.append({**head, "choices": [choice], **extra(result, seq)})
        if extra.last:
            events.append({**head, "choices": [], "usage": usage(results)})
        return events

    await sse.stream(ex, front, jobs, events_of, tail_of, rename)

"""The OpenAI API: ``/v1/completions`` and ``/v1/models`` here, what they share with
``/v1/chat/completions`` (in :mod:`rt.http.openai_chat`) too.

Bodies and answers as OpenAI defines them, so the official client works
unchanged; where rt adds something it is what vLLM and SGLang add
(``matched_stop`` in a choice, ``max_model_len`` and ``root`` in a model,
sampling extensions such as ``top_k``). For a list prompt with ``n > 1``,
choices are prompt-major: prompt ``i``'s sample ``j`` has index ``i * n + j``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import trio

from rt.gpu.sampling_params import show
from rt.http import sse
from rt.http.asgi import Exchange, HTTPError
from rt.http.engine_port import Delta
from rt.http.front import PROMPT, Front
from rt.http.generation import Job, Result, Seq, check_batch_rid, run
from rt.http.openai_format import (
    ChunkUsage,
    TextCursor,
    completion_logprobs,
    echo_logprobs,
    prompt_token_ids,
    token_ids,
    usage,
    with_echo,
)
from rt.http.schemas import CompletionRequest, OpenAISampling

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "n": "n",
    "seed": "seed",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "allowed_token_ids": "allowed_token_ids",
    "include_stop_str_in_output": "no_stop_trim",
    "no_stop_trim": "no_stop_trim",
    "ignore_eos": "ignore_eos",
    "logit_bias": "logit_bias",
    "min_tokens": "min_new_tokens",
    "skip_special_tokens": "skip_special_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "priority": "priority",
    "truncate_prompt_tokens": "truncate_prompt_tokens",
    "add_special_tokens": "add_special_tokens",
}


def model_card(front: Front) -> dict[str, Any]:
    options = front.engine.options
    return {
        "id": served_name(front),
        "object": "model",
        "created": int(front.started_at),
        "owned_by": "rt",
        "root": options.resolved_model_path(),
        "parent": None,
        "max_model_len": front.context_length,
    }


def served_name(front: Front) -> str:
    return front.settings.served_model_name or front.engine.options.model_path or "default"


async def models(front: Front, ex: Exchange, model_id: str | None = None) -> None:
    card = model_card(front)
    if model_id is None:
        await ex.json({"object": "list", "data": [card]})
        return
    if not model_id:  # (a body's "" is no model, as vLLM's; a path's names none)
        raise HTTPError(
            404,
            f"expected a model id after /v1/models/; this server serves {served_name(front)!r}",
            param="model",
            code="model_not_found",
        )
    check_model(front, model_id)
    await ex.json(card)


def check_model(front: Front, model: str | None) -> None:
    """The model a body names: the served one, or "default" (SGLang's name for
    it, which its clients send) ("" is none, as vLLM takes it)."""
    if model and model not in (served_name(front), "default"):
        raise HTTPError(
            404,
            f"the model {model!r} does not exist; this server serves {served_name(front)!r} "
            "(GET /v1/models)",
            param="model",
            code="model_not_found",
        )


def engine_options(front: Front, req: OpenAISampling, max_tokens: int | None) -> dict[str, Any]:
    """The engine's keyword options for the sampling fields of an OpenAI body."""
    check_model(front, req.model)
    if req.request_id is not None:  # vLLM's name for rid ("" is none, as a rid's)
        if req.rid and req.rid != req.request_id:
            raise HTTPError(
                400,
                "request_id and rid (one option, vLLM's and SGLang's names): expected one "
                f"value, got {show(req.request_id)} and {show(req.rid)}",
                param="request_id",
            )
        req.rid = req.request_id
    if req.response_format is not None and req.response_format != {"type": "text"}:
        # (both endpoints: /v1/completions said "unknown field", as vLLM takes it there)
        raise HTTPError(
            400,
            f"response_format: only {{'type': 'text'}} is supported (rt has no constrained "
            f"decoding yet), got {show(req.response_format)}",
            param="response_format",
        )
    if req.stream_options is not None and req.stream_options.model_fields_set and not req.stream:
        # (an empty one asks nothing: vLLM takes it, as its clients send it by default)
        raise HTTPError(400, "stream_options: only with stream=true", param="stream_options")
    trim = {req.include_stop_str_in_output, req.no_stop_trim} - {None}
    if len(trim) > 1:
        raise HTTPError(
            400,
            "include_stop_str_in_output and no_stop_trim (one option, vLLM's and SGLang's "
            "names): expected one value, got both true and false",
            param="no_stop_trim",
        )
    options = {
        engine: getattr(req, name)
        for name, engine in _SAMPLING.items()
        if getattr(req, name) is not None
    }
    if req.seed is not None and not -(2**63) <= req.seed < 2**63:
        raise HTTPError(
            400, f"seed: expected an integer in [-2^63, 2^63-1], got {req.seed}", param="seed"
        )
    if req.seed is not None and req.seed < 0:
        # OpenAI's and vLLM's seed is any int64, the engine's is 63 bits: a negative
        # seed is folded in (-1 draws as 2**63 - 1 does)
        options["seed"] = req.seed % 2**63
    if max_tokens is not None:
        options["max_new_tokens"] = max_tokens
    options["allow_auto_truncate"] = front.settings.allow_auto_truncate
    return options


def rid_field(req: OpenAISampling) -> str:
    """The body's name for the request's id (what an error about it names)."""
    return "request_id" if req.request_id is not None else "rid"


def prompt_jobs(
    prompts: list[Any], options: dict[str, Any], base: str, listed: bool = False, name: str = "rid"
) -> list[Job]:
    """``listed``: the body's prompt is a list of prompts (of one, even: an error
    names ``prompt[0][1]``, not ``prompt[1]``); ``name``: the body's for the rid."""
    check_batch_rid(base, len(prompts) if len(prompts) > 1 else None, name)
    jobs = []
    for i, prompt in enumerate(prompts):
        rid, of = (base, None) if len(prompts) == 1 else (f"{base}-{i}", base)
        where = f"prompt[{i}]" if listed else None
        if isinstance(prompt, str) or "messages" in options:
            jobs.append(Job(prompt, {**options, "rid": rid}, rid, of, where))
        else:
            jobs.append(Job(None, {**options, "input_ids": prompt, "rid": rid}, rid, of, where))
    return jobs


def _check_ids(prompts: list[Any], vocab_size: int, listed: bool) -> None:
    """The engine's check of token-id prompts, for what must decode them first."""
    for k, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            continue
        bad = next((i for i, t in enumerate(prompt) if not 0 <= t < vocab_size), None)
        if bad is not None:  # (named as the engine names it)
            where = f"prompt[{k}][{bad}]" if listed else f"prompt[{bad}]"
            raise HTTPError(
                400,
                f"{where}: expected a token id in [0, {vocab_size}), got {prompt[bad]}",
                param=where,
            )


def choice_finish(seq: Seq, result: Result) -> str | None:
    return seq.finish_reason or ("abort" if result.aborted else None)


def stop_reason(front: Front, req: OpenAISampling, seq: Seq) -> int | str | None:
    """vLLM's ``stop_reason``: the stop string, or the ``stop_token_ids`` id, that
    ended the choice; None for the end of text (EOS, first: also when it is among the
    stop ids, unless ignore_eos) or its length. (SGLang's ``matched_stop`` names the
    EOS id too.)"""
    stop = seq.matched_stop
    if seq.finish_reason != "stop" or stop is None:
        return None
    if isinstance(stop, str):
        return stop
    if stop in (req.stop_token_ids or ()) and (req.ignore_eos or stop not in front.eos_ids):
        return stop
    return None


# ---- /v1/completions ----------------------------------------------------------------


async def completions(front: Front, ex: Exchange, body: bytes) -> None:
    req = await front.parse(CompletionRequest, body)
    n = req.n or 1
    if req.suffix is not None:
        raise HTTPError(400, "suffix: not supported (rt has no fill-in-the-middle)", param="suffix")
    if req.best_of is not None and req.best_of != n:
        raise HTTPError(
            400, f"best_of: only equal to n ({n}) is supported, got {req.best_of}", param="best_of"
        )
    prompts = _prompts(req.prompt)
    # echo with max_tokens 0 scores the prompt, generating nothing (OpenAI's and vLLM's
    # way): the engine draws one token, which is dropped
    prompt_only = bool(req.echo) and req.max_tokens == 0
    max_tokens = req.max_tokens if req.max_tokens is not None else COMPLETION_DEFAULT_MAX_TOKENS
    options = engine_options(front, req, 1 if prompt_only else max_tokens)
    if prompt_only:
        if req.min_tokens:
            raise HTTPError(
                400,
                f"min_tokens: expected at most max_tokens (0), got {req.min_tokens}",
                param="min_tokens",
            )
        # the drawn token is dropped: nothing may end it early or name a stop it matched
        for name in ("stop", "stop_token_ids", "min_new_tokens"):
            options.pop(name, None)
        options["ignore_eos"] = True
    if req.logprobs is not None:
        options["logprobs"] = True
        options["top_logprobs"] = req.logprobs
        options["prompt_logprobs"] = bool(req.echo)  # echo's tokens come with theirs
    if req.logprobs is not None or (
        req.echo
        and (
            front.settings.allow_auto_truncate
            or req.truncate_prompt_tokens is not None
            or not all(isinstance(p, str) for p in prompts)
        )
    ):
        await front.tokens.ensure()
    cid = f"cmpl-{req.rid or uuid.uuid4().hex}"
    listed = isinstance(req.prompt, list) and not isinstance(req.prompt[0], int)
    jobs = prompt_jobs(prompts, options, req.rid or cid, listed, rid_field(req))
    for job in jobs:
        job.prompt_only = prompt_only
    echoes = [""] * len(prompts)
    if req.echo:  # echo decodes the ids here, before the engine has checked them
        _check_ids(prompts, front.vocab_size, listed)
        cut = front.settings.allow_auto_truncate or req.truncate_prompt_tokens is not None
        echoes = await trio.to_thread.run_sync(_echoes, front, prompts, cut)
    rename = {
        "max_new_tokens": "max_tokens",
        "min_new_tokens": "min_tokens",
        "top_logprobs": "logprobs",
        "input_ids": "prompt",
        PROMPT: "prompt",
        "rid": rid_field(req),
    }
    head = {
        "id": cid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": served_name(front),
    }
    skip_special = req.skip_special_tokens is not False  # the output's text leaves them out
    if req.stream:
        await _stream_completions(front, ex, req, jobs, head, echoes, n, rename, skip_special)
        return
    as_ids = bool(req.return_tokens_as_token_ids)
    async with ex.cancel_on_disconnect():
        results = await run(front, jobs, rename=rename)
    if ex.disconnected:
        return
    choices = []
    for i, result in enumerate(results):
        _echo_kept(front, echoes, i, result)
        for j, seq in enumerate(result.seqs):
            choices.append(
                {
                    "index": i * n + j,
                    "text": echoes[i] + seq.text,
                    "logprobs": with_echo(
                        echo_logprobs(front, result.prompt, echoes[i], as_ids)
                        if req.echo
                        else None,
                        completion_logprobs(
                            front,
                            seq.output_ids,
                            seq.logprobs,
                            seq.top_logprobs,
                            TextCursor(len(echoes[i])),
                            skip_special,
                            None if skip_special else seq.text,
                            len(echoes[i]),
                            as_ids,
                        ),
                    )
                    if req.logprobs is not None
                    else None,
                    "finish_reason": choice_finish(seq, result),
                    "matched_stop": seq.matched_stop,
                    "stop_reason": stop_reason(front, req, seq),
                    **token_ids(req.return_token_ids, seq.output_ids),
                    **prompt_token_ids(req.return_token_ids, result),
                }
            )
    await ex.json({**head, "choices": choices, "usage": usage(results)})


def _echoes(front: Front, prompts: list[Any], cut: bool) -> list[str]:
    """Each prompt's text, decoded on a worker thread (7M ids took the event loop
    4 s); not one longer than the context that nothing will cut: the engine
    refuses it."""
    return [
        p
        if isinstance(p, str)
        else ""
        if len(p) > front.context_length and not cut
        else front.tokens.decode(p)
        for p in prompts
    ]


def _echo_kept(front: Front, echoes: list[str], i: int, result: Result) -> None:
    """Echo the prompt the model read: its end alone, when the server cut its start."""
    if echoes[i] and result.kept_ids is not None:
        echoes[i] = front.tokens.decode(result.kept_ids)


def _prompts(prompt: Any) -> list[Any]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise HTTPError(400, "prompt: expected a prompt, got an empty list", param="prompt")
    if isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


async def _stream_completions(
    front: Front,
    ex: Exchange,
    req: CompletionRequest,
    jobs: list[Job],
    head: dict[str, Any],
    echoes: list[str],
    n: int,
    rename: dict[str, str],
    skip_special: bool,
) -> None:
    offsets: dict[int, TextCursor] = {}  # where the next token's text starts, per choice
    extra = ChunkUsage(req.stream_options)
    as_ids = bool(req.return_tokens_as_token_ids)

    def choice(
        index: int,
        text: str,
        seq: Seq,
        delta: Delta | None,
        finish: str | None,
        echo: Any = None,
        first: Result | None = None,
    ) -> Any:
        """One choice of a chunk (``first``: its request's, on the choice's first)."""
        logprobs = None
        if req.logprobs is not None and delta is not None:
            # (the next offset: text held back for a stop string is no matter)
            logprobs = completion_logprobs(
                front,
                delta.output_ids,
                delta.logprobs or (),
                delta.top_logprobs or (),
                offsets.setdefault(index, TextCursor()),
                skip_special,
                None if skip_special else seq.text,
                len(echoes[index // n]),
                as_ids,
            )
            if echo is not None:
                logprobs = with_echo(
                    echo_logprobs(front, echo, echoes[index // n], as_ids), logprobs
                )
        return {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish,
            "matched_stop": seq.matched_stop if finish else None,
            "stop_reason": stop_reason(front, req, seq) if finish else None,
            **token_ids(req.return_token_ids, () if delta is None else delta.output_ids),
            **(prompt_token_ids(req.return_token_ids, first) if first is not None else {}),
        }

    def events_of(i: int, delta: Delta, result: Result) -> list[Any]:
        index = i * n + delta.index
        text, echo, first = delta.text, None, None
        if index not in offsets:
            first = result
            _echo_kept(front, echoes, i, result)
            text = echoes[i] + text
            offsets[index] = TextCursor(len(echoes[i]))
            echo = result.prompt if req.echo else None
        seq = result.seqs[delta.index]
        event = {
            **head,
            "choices": [choice(index, text, seq, delta, delta.finish_reason, echo, first)],
            **extra(result, seq),
        }
        return [event]

    def tail_of(results: list[Result]) -> list[Any]:
        events: list[Any] = []
        for i, result in enumerate(results):
            for j, seq in enumerate(result.seqs):
                if seq.finish_reason is None and result.aborted:
                    index = i * n + j  # (one that never started: its first chunk)
                    first = None if index in offsets else result
                    events.append(
                        {
                            **head,
                            "choices": [choice(index, "", seq, None, "abort", first=first)],
                            **extra(result, seq),
                        }
                    )
        if extra.last:
            events.append({**head, "choices": [], "usage": usage(results)})
        return events

    await sse.stream(ex, front, jobs, events_of, tail_of, rename)

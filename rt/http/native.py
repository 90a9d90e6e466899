"""``POST /generate``: SGLang's native API.

One prompt (``text`` or ``input_ids``) gives one object; a batch (a list of
texts, a list of id lists) or ``n > 1`` gives a list, prompt-major, each
entry with its ``index``. Streaming is SSE, each event carrying the
sequence's text and ids *so far* (as SGLang's do) and ``meta_info``, then
``data: [DONE]``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from rt.gpu.sampling_params import SEED_MASK, show
from rt.http import sse
from rt.http.asgi import Exchange, HTTPError
from rt.http.engine_port import Delta, TopLogprobs
from rt.http.front import PROMPT, Front
from rt.http.generation import Job, Result, Seq, check_batch_rid, run
from rt.http.openai_api import check_model
from rt.http.schemas import GenerateRequest, SamplingParams


async def generate(front: Front, ex: Exchange, body: bytes) -> None:
    req = await front.parse(GenerateRequest, body)
    jobs, batch = build_jobs(front, req)
    multi = batch or any(job.options.get("n", 1) != 1 for job in jobs)
    if req.return_logprob and req.return_text_in_logprobs:
        await front.tokens.ensure()
    if req.stream:

        def events_of(i: int, delta: Delta, result: Result) -> list[Any]:
            seq = result.seqs[delta.index]
            out = output(front, req, result, seq, delta.index)
            if multi:
                out["index"] = _index(jobs, i, delta.index)
            return [out]

        await sse.stream(
            ex,
            front,
            jobs,
            events_of,
            lambda results: _aborted(front, req, jobs, results),
            renames(req),
        )
        return
    async with ex.cancel_on_disconnect():
        results = await run(front, jobs, rename=renames(req))
    if ex.disconnected:
        return
    outs = []
    for i, result in enumerate(results):
        for j, seq in enumerate(result.seqs):
            out = output(front, req, result, seq, j)
            if multi:
                out["index"] = _index(jobs, i, j)
            outs.append(out)
    await ex.json(outs if multi else outs[0])


def renames(req: GenerateRequest) -> dict[str, str]:
    """The engine's names for the body's fields (see ``http_error``): a sampling
    parameter is under ``sampling_params`` (a list of them: ``in_batch`` names
    its place)."""
    names = {"top_logprobs": "top_logprobs_num", PROMPT: prompt_field(req)}
    if not isinstance(req.sampling_params, list):
        names |= {f: f"sampling_params.{f}" for f in SamplingParams.model_fields}
    return names


def prompt_field(req: GenerateRequest) -> str:
    """The field that holds the prompt(s): what an error about them names."""
    return "text" if req.text is not None else "input_ids"


def build_jobs(front: Front, req: GenerateRequest) -> tuple[list[Job], bool]:
    """The engine requests of one body, and whether it is a batch."""
    if (req.text is None) == (req.input_ids is None):
        given = "both" if req.text is not None else "neither"
        raise HTTPError(
            400, f"expected exactly one of text or input_ids, got {given}", param="text"
        )
    prompts: list[Any]
    if isinstance(req.text, list):
        prompts, batch = list(req.text), True
    elif req.input_ids and isinstance(req.input_ids[0], list):
        prompts, batch = list(req.input_ids), True
    else:
        prompts, batch = [req.text if req.text is not None else req.input_ids], False
    if batch and not prompts:
        field = prompt_field(req)
        raise HTTPError(
            400, f"{field}: expected at least one prompt, got an empty batch", param=field
        )
    sampling = req.sampling_params
    if isinstance(sampling, list):
        if len(sampling) != len(prompts):
            raise HTTPError(
                400,
                f"sampling_params: expected one per prompt ({len(prompts)}), got {len(sampling)}",
                param="sampling_params",
            )
        per_prompt = sampling
    else:
        per_prompt = [sampling or SamplingParams()] * len(prompts)
    rids = req.rid if isinstance(req.rid, list) else None
    if rids is not None and len(rids) != len(prompts):
        raise HTTPError(
            400, f"rid: expected one per prompt ({len(prompts)}), got {len(rids)}", param="rid"
        )
    first: dict[str, int] = {}
    for k, given in enumerate(rids or ()):
        if given and first.setdefault(given, k) != k:
            raise HTTPError(
                400,
                f"rid[{k}]: {given!r} is rid[{first[given]}] too; each prompt of a batch needs "
                "a rid of its own",
                param=f"rid[{k}]",
            )
    check_model(front, req.model)
    start = req.logprob_start_len if req.return_logprob else None  # (else unread, as SGLang's)
    if start is not None and start < -1:
        raise HTTPError(
            400,
            "logprob_start_len: expected -1 (no prompt logprobs), or a prompt position >= 0, "
            f"got {start}",
            param="logprob_start_len",
        )
    base = req.rid if isinstance(req.rid, str) and req.rid else uuid.uuid4().hex  # "": none
    check_batch_rid(base, len(prompts) if batch else None)
    jobs = []
    for i, (prompt, params) in enumerate(zip(prompts, per_prompt, strict=True)):
        options = params.model_dump(exclude_none=True)
        _sampling_seed(options, params_where_of(sampling, i))
        options["allow_auto_truncate"] = front.settings.allow_auto_truncate
        prompt_only = options.get("max_new_tokens") == 0
        if prompt_only:  # SGLang's prefill alone (a prefix cached, a prompt scored)
            _prompt_only(options, params_where_of(sampling, i))
        if req.return_logprob:  # (top_logprobs_num alone asks for nothing, as SGLang's)
            options["logprobs"] = True
            options["top_logprobs"] = req.top_logprobs_num or 0
            options["prompt_logprobs"] = start is not None and start >= 0
            if start is not None and start >= 0:
                options["logprob_start_len"] = start  # past the prompt: refused once tokenized
        if req.priority is not None:
            options["priority"] = req.priority
        own = rids[i] if rids is not None else None  # ("": none, as a single rid)
        rid = own or (base if not batch else f"{base}-{i}")
        options["rid"] = rid
        of = base if batch and not own else None
        where = f"{'text' if req.text is not None else 'input_ids'}[{i}]" if batch else None
        params_where = f"sampling_params[{i}]" if isinstance(sampling, list) else None
        if isinstance(prompt, list):
            job = Job(None, {**options, "input_ids": prompt}, rid, of, where, params_where)
        else:
            job = Job(prompt, options, rid, of, where, params_where)
        job.prompt_only = prompt_only
        jobs.append(job)
    return jobs, batch


def params_where_of(sampling: Any, i: int) -> str:
    """Where prompt i's sampling parameters are in the body."""
    return f"sampling_params[{i}]" if isinstance(sampling, list) else "sampling_params"


def _sampling_seed(options: dict[str, Any], where: str) -> None:
    """SGLang's ``sampling_seed`` is the seed by its name (one value, if both)."""
    if "sampling_seed" not in options:
        return
    seed = options.pop("sampling_seed")
    if not 0 <= seed <= SEED_MASK:  # (here: the engine's refusal would name seed)
        raise HTTPError(
            400,
            f"{where}.sampling_seed: expected an integer in [0, {SEED_MASK}], got {show(seed)}",
            param=f"{where}.sampling_seed",
        )
    if options.setdefault("seed", seed) != seed:
        raise HTTPError(
            400,
            f"{where}.sampling_seed and {where}.seed (one option, SGLang's and rt's names): "
            f"expected one value, got {seed} and {options['seed']}",
            param=f"{where}.sampling_seed",
        )


def _prompt_only(options: dict[str, Any], where: str) -> None:
    """``max_new_tokens: 0``: the engine draws one token, which is dropped
    (``Job.prompt_only``); nothing may end it early or name a stop it matched."""
    if options.get("min_new_tokens"):
        raise HTTPError(
            400,
            f"{where}.min_new_tokens: expected at most max_new_tokens (0), "
            f"got {options['min_new_tokens']}",
            param=f"{where}.min_new_tokens",
        )
    for name in ("stop", "stop_token_ids", "min_new_tokens"):
        options.pop(name, None)
    options["max_new_tokens"], options["ignore_eos"] = 1, True


def output(front: Front, req: GenerateRequest, result: Result, seq: Seq, j: int) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": result.rid,
        "finish_reason": finish_reason(seq, result.aborted),
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": len(seq.output_ids),
        "cached_tokens": result.cached_tokens,
        "e2e_latency": result.elapsed(),
    }
    if req.return_logprob:
        text = front.tokens.text if req.return_text_in_logprobs else None
        meta.update(output_logprobs(front, req, seq.output_ids, seq.logprobs, seq.top_logprobs))
        prompt, start = result.prompt, req.logprob_start_len or 0
        meta["input_token_logprobs"] = []  # (SGLang's has the key always)
        if req.top_logprobs_num:
            meta["input_top_logprobs"] = []
        if prompt is not None:  # from position logprob_start_len; the first token has none
            lps: list[float | None] = [None, *prompt.logprobs]
            meta["input_token_logprobs"] = [
                [lp, tok, text(tok) if text else None]
                for lp, tok in zip(lps, prompt.ids, strict=False)
            ][start:]
            if req.top_logprobs_num and prompt.top_logprobs is not None:
                meta["input_top_logprobs"] = [
                    None,
                    *(
                        [[lp, tok, text(tok) if text else None] for tok, lp in top]
                        for top in prompt.top_logprobs
                    ),
                ][start:]
    return {"text": seq.text, "output_ids": list(seq.output_ids), "meta_info": meta}


def output_logprobs(
    front: Front,
    req: GenerateRequest,
    ids: Sequence[int],
    logprobs: Sequence[float],
    tops: Sequence[TopLogprobs] | None,
) -> dict[str, Any]:
    """``output_token_logprobs`` (and ``output_top_logprobs``, when asked) of
    these tokens: ``[logprob, token id, its text or None]`` each."""
    text = front.tokens.text if req.return_text_in_logprobs else None
    out: dict[str, Any] = {
        "output_token_logprobs": [
            [lp, tok, text(tok) if text else None] for lp, tok in zip(logprobs, ids, strict=False)
        ]
    }
    if req.top_logprobs_num and tops is not None:
        out["output_top_logprobs"] = [
            [[lp, tok, text(tok) if text else None] for tok, lp in top] for top in tops
        ]
    return out


def finish_reason(seq: Seq, aborted: str | None) -> dict[str, Any] | None:
    if seq.finish_reason is None:
        return {"type": "abort", "message": f"aborted ({aborted})"} if aborted else None
    if seq.finish_reason == "length":
        return {"type": "length", "length": len(seq.output_ids)}
    return {"type": seq.finish_reason, "matched": seq.matched_stop}


def _index(jobs: list[Job], i: int, j: int) -> int:
    """Prompt-major: prompt i's sample j."""
    return sum(job.options.get("n", 1) for job in jobs[:i]) + j


def _aborted(
    front: Front, req: GenerateRequest, jobs: list[Job], results: list[Result]
) -> list[Any]:
    """After the last delta: a final event for each sequence an abort cut short."""
    events = []
    for i, result in enumerate(results):
        if result.aborted is None:
            continue
        for j, seq in enumerate(result.seqs):
            if seq.finish_reason is None:
                out = output(front, req, result, seq, j)
                out["index"] = _index(jobs, i, j)
                events.append(out)
    return events

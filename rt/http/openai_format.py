"""OpenAI's shapes for usage and logprobs (token strings from the front's tokenizer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rt.http.engine_port import TopLogprobs
from rt.http.front import Front
from rt.http.generation import Result


def usage(results: list[Result]) -> dict[str, Any]:
    prompt = sum(r.prompt_tokens for r in results)
    completion = sum(r.completion_tokens for r in results)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(r.cached_tokens for r in results)},
    }


def completion_logprobs(
    front: Front,
    ids: Sequence[int],
    logprobs: Sequence[float],
    tops: Sequence[TopLogprobs],
    offset: int,
) -> dict[str, Any]:
    """The legacy completions format; ``offset``: where these tokens' text starts."""
    text = front.tokens.text
    tokens = [text(t) for t in ids]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": list(logprobs),
        "top_logprobs": [{text(t): lp for t, lp in top} for top in tops] if tops else None,
        "text_offset": offsets,
    }


def chat_logprobs(
    front: Front, ids: Sequence[int], logprobs: Sequence[float], tops: Sequence[TopLogprobs]
) -> dict[str, Any]:
    text = front.tokens.text
    content = []
    for k, (tok, lp) in enumerate(zip(ids, logprobs, strict=False)):
        token = text(tok)
        top = tops[k] if k < len(tops) else ()
        content.append(
            {
                "token": token,
                "logprob": lp,
                "bytes": list(token.encode()),
                "top_logprobs": [
                    {"token": text(t), "logprob": v, "bytes": list(text(t).encode())}
                    for t, v in top
                ],
            }
        )
    return {"content": content, "refusal": None}

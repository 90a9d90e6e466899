"""OpenAI's shapes for usage and logprobs (token strings and bytes from the front's tokenizer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rt.http.engine_port import Prompt, TopLogprobs
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
    skip_special: bool,
) -> tuple[dict[str, Any], int]:
    """The legacy completions format, and where the next token's text starts;
    ``offset``: where these tokens' text starts in the choice's text (see
    text_offsets)."""
    text = front.tokens.text
    offsets, after = text_offsets(front, ids, offset, skip_special)
    return {
        "tokens": [text(t) for t in ids],
        "token_logprobs": list(logprobs),
        "top_logprobs": [{text(t): lp for t, lp in top} for top in tops] if tops else None,
        "text_offset": offsets,
    }, after


def text_offsets(
    front: Front, ids: Sequence[int], offset: int, skip_special: bool, text: str | None = None
) -> tuple[list[int], int]:
    """Where each token starts in the choice's text, and where the next would:
    each token is as long as its own text, but a special token the text leaves
    out is not there at all (an output's, with ``skip_special``; the BOS the
    tokenizer put before an echoed ``text``, which does not hold it)."""
    offsets = []
    for t in ids:
        offsets.append(offset)
        token = front.tokens.text(t)
        if front.tokens.special(t) and (
            skip_special if text is None else not text.startswith(token, offset)
        ):
            continue
        offset += len(token)
    return offsets, offset


def echo_logprobs(front: Front, prompt: Prompt | None, echo: str) -> dict[str, Any] | None:
    """The echoed prompt's part of the legacy format (``echo``: its text): its
    first token has no logprob (nothing comes before it), as OpenAI's."""
    if prompt is None:
        return None
    text = front.tokens.text
    tops = prompt.top_logprobs
    return {
        "tokens": [text(t) for t in prompt.ids],
        "token_logprobs": [None, *prompt.logprobs],
        "top_logprobs": [None, *({text(t): lp for t, lp in top} for top in tops)] if tops else None,
        "text_offset": text_offsets(front, prompt.ids, 0, False, echo)[0],
    }


def with_echo(echo: dict[str, Any] | None, out: dict[str, Any]) -> dict[str, Any]:
    """The prompt's logprobs (``echo``, when asked) followed by the output's."""
    if echo is None:
        return out
    tops = None
    if echo["top_logprobs"] is not None or out["top_logprobs"] is not None:
        tops = (echo["top_logprobs"] or [None] * len(echo["tokens"])) + (
            out["top_logprobs"] or [None] * len(out["tokens"])
        )
    return {
        "tokens": echo["tokens"] + out["tokens"],
        "token_logprobs": echo["token_logprobs"] + out["token_logprobs"],
        "top_logprobs": tops,
        "text_offset": echo["text_offset"] + out["text_offset"],
    }


def chat_logprobs(
    front: Front, ids: Sequence[int], logprobs: Sequence[float], tops: Sequence[TopLogprobs]
) -> dict[str, Any]:
    text, raw = front.tokens.text, front.tokens.bytes
    content = []
    for k, (tok, lp) in enumerate(zip(ids, logprobs, strict=False)):
        token = text(tok)
        top = tops[k] if k < len(tops) else ()
        content.append(
            {
                "token": token,
                "logprob": lp,
                "bytes": raw(tok),
                "top_logprobs": [{"token": text(t), "logprob": v, "bytes": raw(t)} for t, v in top],
            }
        )
    return {"content": content, "refusal": None}

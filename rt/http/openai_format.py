"""OpenAI's shapes for usage and logprobs (token strings and bytes from the front's tokenizer)."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from typing import Any

from rt.http.engine_port import Prompt, TopLogprobs
from rt.http.front import Front
from rt.http.generation import Result, Seq


def usage(results: list[Result]) -> dict[str, Any]:
    prompt = sum(r.prompt_tokens for r in results)
    completion = sum(r.completion_tokens for r in results)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(r.cached_tokens for r in results)},
    }


def seq_usage(result: Result, seq: Seq) -> dict[str, Any]:
    """One choice's usage so far: its prompt's tokens and its own (a chunk's usage
    with vLLM's ``stream_options.continuous_usage_stats``)."""
    prompt, completion = result.prompt_tokens, len(seq.output_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def token_ids(asked: bool | None, ids: Sequence[int]) -> dict[str, Any]:
    """vLLM's ``return_token_ids``: a choice's token ids (a chunk's new ones)."""
    return {"token_ids": list(ids)} if asked else {}


def prompt_token_ids(asked: bool | None, result: Result) -> dict[str, Any]:
    """vLLM's ``return_token_ids``: the prompt's ids, as the model read them."""
    if not asked:
        return {}
    ids = result.input_ids
    return {"prompt_token_ids": None if ids is None else ids.tolist()}


class ChunkUsage:
    """What each chunk of a stream says of usage: nothing, ``null`` (``include_usage``:
    the last chunk has it), or the choice's so far (``continuous_usage_stats`` too)."""

    def __init__(self, options: Any) -> None:
        # vLLM's continuous_usage_stats alone implies include_usage (its default is true)
        self.last = options is not None and (
            bool(options.include_usage)
            or (options.include_usage is None and bool(options.continuous_usage_stats))
        )
        self.continuous = self.last and bool(options.continuous_usage_stats)

    def __call__(self, result: Result | None = None, seq: Seq | None = None) -> dict[str, Any]:
        if not self.last:
            return {}
        if self.continuous and result is not None and seq is not None:
            return {"usage": seq_usage(result, seq)}
        return {"usage": None}


class TextCursor:
    """Where the next token's text starts in a choice's text, in characters, and
    the bytes of a character its tokens have begun and not finished (a token may
    be a piece of a UTF-8 character: the character starts where its first piece
    does, and counts once, when its last piece arrives)."""

    def __init__(self, at: int = 0) -> None:
        self.at = at
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def settle(self, data: bytes) -> None:
        """Before a token of bytes ``data`` is placed: the bytes of a character
        begun before it that ``data`` cannot go on with end there, as one U+FFFD
        each (the text shows it before this token's text, not within it)."""
        pending, _ = self._utf8.getstate()
        if pending and data and not 0x80 <= data[0] < 0xC0:  # (no continuation byte)
            self.at += len(self._utf8.decode(b"", True))

    def advance(self, data: bytes) -> None:
        self.at += len(self._utf8.decode(data))


def completion_logprobs(
    front: Front,
    ids: Sequence[int],
    logprobs: Sequence[float],
    tops: Sequence[TopLogprobs],
    cursor: TextCursor,
    skip_special: bool,
    choice_text: str | None = None,
    base: int = 0,
    as_ids: bool = False,
) -> dict[str, Any]:
    """The legacy completions format; ``cursor``: where these tokens' text starts in
    the choice's text (see text_offsets, with ``choice_text`` and ``base``), moved
    past them. ``top_logprobs`` holds each token's own logprob and its best
    alternatives', as OpenAI's: with ``logprobs=0``, the token's alone. ``as_ids``:
    each token named ``token_id:N`` (vLLM's ``return_tokens_as_token_ids``)."""
    name = token_name(front, as_ids)
    return {
        "tokens": [name(t) for t in ids],
        "token_logprobs": list(logprobs),
        "top_logprobs": _tops(front, ids, logprobs, tops, as_ids),
        "text_offset": text_offsets(front, ids, cursor, skip_special, choice_text, base),
    }


def token_name(front: Front, as_ids: bool) -> Callable[[int], str]:
    """How a logprobs format names a token: its text, or ``token_id:N`` (vLLM's
    ``return_tokens_as_token_ids``: a client can tell apart tokens whose text is
    the same, or a piece of a character)."""
    return (lambda t: f"token_id:{t}") if as_ids else front.tokens.text


def _tops(
    front: Front,
    ids: Sequence[int],
    logprobs: Sequence[float],
    tops: Sequence[TopLogprobs],
    as_ids: bool = False,
) -> list[dict[str, float]]:
    name = token_name(front, as_ids)
    out = []
    for k, (tok, lp) in enumerate(zip(ids, logprobs, strict=False)):
        entry = {name(tok): lp}
        for alt, alt_lp in tops[k] if k < len(tops) else ():
            entry.setdefault(name(alt), alt_lp)
        out.append(entry)
    return out


def text_offsets(
    front: Front,
    ids: Sequence[int],
    cursor: TextCursor,
    skip_special: bool,
    text: str | None = None,
    base: int = 0,
) -> list[int]:
    """Where each token starts in the choice's text (``cursor`` moved past them):
    each token is as long as its own bytes decode to, but a special token the text
    leaves out is not there at all (an output's, with ``skip_special``; the BOS
    the tokenizer put before an echoed ``text``, which does not hold it). Where
    ``text`` (the choice's text from ``base`` on, so much of it as has come)
    reaches, it says whether a special token is shown; past its end (text a stop
    string holds back, or cut off by one), ``skip_special`` does: a stream and the
    whole answer give the same offsets."""
    offsets = []
    for t in ids:
        token = front.tokens.text(t) if front.tokens.special(t) else None
        data = token.encode() if token is not None else bytes(front.tokens.bytes(t))
        cursor.settle(data)
        offsets.append(cursor.at)
        if token is not None:
            at = cursor.at - base
            if text is not None and len(text) - at >= len(token):  # it reaches: it says
                shown = text.startswith(token, at)
            else:
                shown = not skip_special
            if not shown:
                continue
        cursor.advance(data)
    return offsets


def echo_logprobs(
    front: Front, prompt: Prompt | None, echo: str, as_ids: bool = False
) -> dict[str, Any] | None:
    """The echoed prompt's part of the legacy format (``echo``: its text): its
    first token has no logprob (nothing comes before it), as OpenAI's."""
    if prompt is None:
        return None
    name = token_name(front, as_ids)
    tops = _tops(front, prompt.ids[1:], prompt.logprobs, prompt.top_logprobs or (), as_ids)
    return {
        "tokens": [name(t) for t in prompt.ids],
        "token_logprobs": [None, *prompt.logprobs],
        "top_logprobs": [None, *tops],
        # (the echo is the whole prompt's text: a special token it does not reach is not in it)
        "text_offset": text_offsets(front, prompt.ids, TextCursor(), True, echo),
    }


def with_echo(echo: dict[str, Any] | None, out: dict[str, Any]) -> dict[str, Any]:
    """The prompt's logprobs (``echo``, when asked) followed by the output's."""
    if echo is None:
        return out
    return {
        "tokens": echo["tokens"] + out["tokens"],
        "token_logprobs": echo["token_logprobs"] + out["token_logprobs"],
        "top_logprobs": echo["top_logprobs"] + out["top_logprobs"],
        "text_offset": echo["text_offset"] + out["text_offset"],
    }


def chat_logprobs(
    front: Front,
    ids: Sequence[int],
    logprobs: Sequence[float],
    tops: Sequence[TopLogprobs],
    as_ids: bool = False,
) -> dict[str, Any]:
    text, raw = token_name(front, as_ids), front.tokens.bytes
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

"""``POST /tokenize`` and ``POST /detokenize``, as vLLM and SGLang serve them.

``/tokenize`` encodes text with the tokenizer the engine's workers load
(``rt.tok.load``, the same call with the same ``add_special_tokens``), so its
ids are the ones a completion of that text would be given. It runs in the
main process, in a worker thread (loaded on first use), one request at a
time, within a budget (below). Chat messages are not taken: a chat template is code
whose render needs the tokenizer worker's time limit, which only the
worker's own thread has (``rt/tok/timelimit.py``).

``/detokenize`` decodes ids with special tokens kept, as vLLM does (SGLang's
``skip_special_tokens`` drops them, when sent).
The answer carries the text under vLLM's name (``prompt``) and SGLang's
(``text``), so either's client reads it.
"""

from __future__ import annotations

from typing import Any, cast

import trio

from rt.http.asgi import Exchange, HTTPError
from rt.http.front import Front
from rt.http.openai_api import check_model
from rt.http.schemas import DetokenizeRequest, TokenizeRequest

# A tokenizer holds ~250 bytes per token of what it encodes (offsets, strings), and
# ~1.6 KB per text: 16 MiB of text took 4 GiB of the server's memory and 18 s. So a
# request's texts are bounded in UTF-8 bytes (a byte-level tokenizer makes at most a
# token of each), each text counting PER_TEXT more; and the ids to decode.
MAX_BYTES = 1 << 20
PER_TEXT = 1 << 10
MAX_IDS = 1 << 20


async def tokenize(front: Front, ex: Exchange, body: bytes) -> None:
    req = await front.parse(TokenizeRequest, body)
    check_model(front, req.model)
    if req.messages is not None:
        raise HTTPError(
            400,
            "messages: /tokenize takes a prompt (text), not chat messages; send the text the "
            "chat template renders, or read usage.prompt_tokens of a chat completion",
            param="messages",
        )
    if (req.prompt is None) == (req.text is None):
        given = "both" if req.prompt is not None else "neither"
        raise HTTPError(400, f"prompt: expected one of prompt or text, got {given}", param="prompt")
    prompt = req.prompt if req.prompt is not None else req.text
    texts = [prompt] if isinstance(prompt, str) else list(prompt or [])
    field = "prompt" if req.prompt is not None else "text"
    if not texts:
        raise HTTPError(400, f"{field}: expected a text or a list of texts, got []", param=field)
    cost = PER_TEXT * len(texts) + sum(map(len, texts))  # (a character is 1 to 4 bytes)
    if cost <= MAX_BYTES:  # (counted in bytes only then: a 16 MiB text is over at once)
        cost = PER_TEXT * len(texts) + sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    if cost > MAX_BYTES:
        raise HTTPError(
            413,
            f"{field}: at most {MAX_BYTES} bytes of UTF-8 text per request, each text "
            f"counting {PER_TEXT} more; got {len(texts)} text(s) over that; split them "
            "across requests",
            param=field,
            code="text_too_long",
        )
    ids = await front.encoder.encode(texts, req.add_special_tokens, field)
    out: dict[str, Any] = {
        "tokens": ids[0] if isinstance(prompt, str) else ids,
        "count": len(ids[0]) if isinstance(prompt, str) else [len(i) for i in ids],
        "max_model_len": front.context_length,
    }
    if req.return_token_strs:
        await front.tokens.ensure()
        piece = front.tokens.vocab.piece
        strs = await trio.to_thread.run_sync(lambda: [[piece(t) for t in one] for one in ids])
        out["token_strs"] = strs[0] if isinstance(prompt, str) else strs
    await ex.json(out)


async def detokenize(front: Front, ex: Exchange, body: bytes) -> None:
    req = await front.parse(DetokenizeRequest, body)
    check_model(front, req.model)
    single = not req.tokens or isinstance(req.tokens[0], int)
    lists = [cast(list[int], req.tokens)] if single else cast(list[list[int]], req.tokens)
    count = sum(map(len, lists))
    if count > MAX_IDS:
        raise HTTPError(
            413,
            f"tokens: at most {MAX_IDS} token ids per request, got {count}; split them",
            param="tokens",
            code="too_many_tokens",
        )
    await front.tokens.ensure()
    skip = bool(req.skip_special_tokens)
    texts = await trio.to_thread.run_sync(_decode, front, lists, single, skip)
    text: str | list[str] = texts[0] if single else texts
    await ex.json({"prompt": text, "text": text})


def _decode(front: Front, lists: list[list[int]], single: bool, skip: bool) -> list[str]:
    """Off the trio thread: a body's size allows millions of ids."""
    for k, ids in enumerate(lists):
        bad = next((t for t in ids if not 0 <= t < front.vocab_size), None)
        if bad is not None:
            field = "tokens" if single else f"tokens[{k}]"
            raise HTTPError(
                400,
                f"{field}: expected token ids in [0, {front.vocab_size}), got {bad}",
                param=field,
            )
    if skip:
        specials = front.tokens.vocab.specials
        lists = [[t for t in ids if t not in specials] for ids in lists]
    return [front.tokens.decode(ids) for ids in lists]

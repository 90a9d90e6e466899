"""Text, token ids or chat messages → validated, tokenized requests.

One call handles a batch: chat messages are rendered with the model's chat
template, every text is encoded in one call of the (Rust) tokenizer, and
each request is validated on its own, so a bad request is refused alone.

Whatever one request makes raise is that request's refusal, never the
caller's exception: a batched tokenizer call that raises is retried text by
text to find the texts it fails on. Only a death of the process (which no
``except`` sees) is left to the actor's poison marks.
"""

from __future__ import annotations

import dataclasses
import logging
import reprlib
from collections.abc import Sequence
from types import FrameType
from typing import Any, TypeVar

import numpy as np

from rt.errors import (
    ContextOverflowError,
    InvalidRequestError,
    RequestError,
    RequestFailedError,
    no_room_for_prompt,
)
from rt.gpu.sampling_params import SamplingParams
from rt.messages import GenerateRequest, Refused, Scheduled, Tokenized
from rt.tok.timelimit import TimeLimitExceeded, time_limit

log = logging.getLogger(__name__)

Result = tuple[Scheduled, Tokenized] | Refused


def max_token_bytes(tokenizer: Any) -> int | None:
    """At most how many bytes of text one token stands for: the UTF-8 length of the
    vocabulary's longest entry (byte-level, SentencePiece and byte-fallback entries
    spell a token's bytes in at least as many); None if the vocabulary is unknown."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:
        return None
    return max((len(t.encode("utf-8", "surrogatepass")) for t in vocab), default=0) or None


class TokenizerCore:
    def __init__(
        self,
        tokenizer: Any,
        context_length: int,
        vocab_size: int,
        render_limit_s: float = 0.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.vocab_size = vocab_size
        # a chat template rendering longer than this is stopped and its request refused
        # (0: no limit); it takes effect where templates render: the main thread
        self.render_limit_s = render_limit_s
        # a text longer than this cannot fit the context: refused (or cut) before it is
        # tokenized, which for a text of megabytes took longer than the watchdog allows
        per_token = max_token_bytes(tokenizer)
        self.max_text_bytes = None if per_token is None else context_length * per_token
        # OpenAI's newer name for "system": a template that does not know it gets it as
        # that (one that knows only system/user/assistant refused it; others dropped it)
        self.developer_as_system = "developer" not in str(getattr(tokenizer, "chat_template", ""))

    def process(self, reqs: Sequence[GenerateRequest]) -> list[Result]:
        """One result per request, in order: the request for the scheduler and the
        ids for the frontend, or why it was refused. Never raises for a request."""
        return self.encode(reqs, [self.text(req) for req in reqs])

    def text(self, req: GenerateRequest) -> str | Exception | None:
        """The first half of :meth:`process`, one request at a time and in the main
        thread (the chat template's time limit works there): its text, chat messages
        rendered, or None for input_ids, or why it has none."""
        try:
            return self._bounded(req, self._text_of(req))
        except RequestError as err:  # the request's own fault: its message is all it needs
            return untraced(err)
        except Exception as err:  # a bug its input reached: logged with its traceback
            return err

    def encode(
        self, reqs: Sequence[GenerateRequest], texts: Sequence[str | Exception | None]
    ) -> list[Result]:
        """The second half of :meth:`process`: every text in one tokenizer call, each
        request validated on its own. Off the main thread if need be."""
        results: list[Result | None] = [None] * len(reqs)
        todo: dict[int, str] = {}
        plain: dict[int, bool] = {}
        for i, (req, text) in enumerate(zip(reqs, texts, strict=True)):
            if isinstance(text, Exception):
                results[i] = refusal(req.rid, text)
            elif text is not None:
                todo[i] = text
                plain[i] = (
                    req.messages is None
                    if req.add_special_tokens is None
                    else req.add_special_tokens
                )
        encoded = self._encode(todo, plain)
        for i, req in enumerate(reqs):
            if results[i] is not None:
                continue
            try:
                ids = encoded[i] if i in encoded else list(req.input_ids or ())
                if isinstance(ids, Exception):
                    raise unencodable(ids) from ids
                results[i] = self._validate(req, ids)
            except Exception as err:
                results[i] = refusal(req.rid, err)
        return [r for r in results if r is not None]  # every one is set by now

    def _text_of(self, req: GenerateRequest) -> str | None:
        given = [
            name for name in ("text", "input_ids", "messages") if getattr(req, name) is not None
        ]
        if len(given) != 1:
            raise InvalidRequestError(
                f"expected exactly one of text, input_ids or messages; got {given or 'none'}"
            )
        if req.text is not None:
            if not isinstance(req.text, str):
                raise InvalidRequestError(f"text: expected a string, got {type(req.text).__name__}")
            return req.text
        if req.messages is not None:
            return self._render_chat(req.messages, req.template_kwargs or {})
        return None

    def _bounded(self, req: GenerateRequest, text: str | None) -> str | None:
        """``text``, or its end if it is too long for the context and truncation is
        allowed; refused if it is too long and truncation is not."""
        limit = self.max_text_bytes
        if text is None or limit is None or len(text) * 4 <= limit:
            return text
        data = text.encode("utf-8", "surrogatepass")
        if len(data) <= limit:
            return text
        if not (req.allow_auto_truncate or req.keep_last):
            raise ContextOverflowError(
                f"the prompt is {len(data)} bytes, more than the context length "
                f"{self.context_length} can hold in tokens of this tokenizer (at most "
                f"{limit} bytes); shorten the prompt or set allow_auto_truncate"
            )
        # keep the end, as the ids' truncation does (it then cuts to the budget)
        return data[-limit:].decode("utf-8", "ignore")  # (a character cut in two is dropped)

    def _render_chat(self, messages: Sequence[Any], variables: dict[str, Any]) -> str:
        """The messages through the chat template, with the request's variables
        (``chat_template_kwargs``, checked by the frontend)."""
        if not messages:
            raise InvalidRequestError("messages: expected at least one message, got none")
        for k, msg in enumerate(messages):
            if not isinstance(msg, dict) or "role" not in msg or "content" not in msg:
                raise InvalidRequestError(
                    f"messages[{k}]: expected an object with 'role' and 'content', got {msg!r}"
                )
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidRequestError(
                "messages: this model has no chat template; send text or input_ids instead"
            )
        messages = list(messages)
        if self.developer_as_system:
            messages = [
                {**m, "role": "system"} if m["role"] == "developer" else m for m in messages
            ]
        opening = not variables.get("continue_final_message", False)
        given = {"add_generation_prompt": opening, **variables}
        try:
            with time_limit(self.render_limit_s):
                text = self.tokenizer.apply_chat_template(messages, tokenize=False, **given)
        except TimeLimitExceeded:
            set_by_client = (
                f" with chat_template_kwargs {reprlib.repr(variables)}" if variables else ""
            )
            raise InvalidRequestError(
                f"messages: the chat template ran past its time limit ({self.render_limit_s:g} "
                f"s) rendering them{set_by_client}, and was stopped; send a shorter "
                "conversation or other template variables"
            ) from None
        except Exception as err:  # a template error is the caller's input, not a crash
            said = str(err)  # (it may quote the whole chat: raise_exception(content))
            said = said if len(said) <= 1000 else f"{said[:1000]}… ({len(said)} characters)"
            raise InvalidRequestError(f"messages: the chat template failed: {said}") from err
        return str(text)

    def _encode(
        self, texts: dict[int, str], plain: dict[int, bool]
    ) -> dict[int, list[int] | Exception]:
        """Encode every text in at most two tokenizer calls (with and without special tokens:
        a rendered chat template already holds them). A call that raises is redone text by
        text: each text's ids, or what encoding it alone raised."""
        out: dict[int, list[int] | Exception] = {}
        for add_special in (True, False):
            idx = [i for i in texts if plain[i] == add_special]
            if idx:
                ids = encode_each(self.tokenizer, [texts[i] for i in idx], add_special)
                out.update(zip(idx, ids, strict=True))
        return out

    def _validate(self, req: GenerateRequest, ids: list[int]) -> tuple[Scheduled, Tokenized]:
        if not ids:
            raise InvalidRequestError("the prompt is empty: expected at least one token")
        bad = next(
            (
                t
                for t in ids
                if isinstance(t, bool)
                or not isinstance(t, int | np.integer)
                or not 0 <= t < self.vocab_size
            ),
            None,
        )
        if bad is not None:
            raise InvalidRequestError(
                f"input_ids: expected token ids in [0, {self.vocab_size}), got {bad!r}"
            )
        truncated = max(len(ids) - req.keep_last, 0) if req.keep_last else 0
        ids = ids[truncated:]  # truncate_prompt_tokens: the prompt's last keep_last
        sampling = req.sampling
        if req.to_context:  # max_new_tokens: the room the prompt leaves
            room = self.context_length - len(ids)
            if room < 1 and req.allow_auto_truncate:  # the prompt is cut: room for the default
                room = min(SamplingParams.max_new_tokens, self.context_length - 1)
            sampling = dataclasses.replace(sampling, max_new_tokens=max(room, 1))
            if room >= 1 and sampling.min_new_tokens > room:
                raise ContextOverflowError(
                    f"the prompt has {len(ids)} tokens, which leave room for {room} new tokens "
                    f"in the context length {self.context_length}, fewer than min_new_tokens "
                    f"({sampling.min_new_tokens}) asks for"
                )
        sampling.validate(self.vocab_size)
        budget = self.context_length - sampling.max_new_tokens
        if len(ids) > budget:
            if not req.allow_auto_truncate or budget < 1:
                raise ContextOverflowError(self._overflow(req, len(ids), sampling))
            truncated += len(ids) - budget
            ids = ids[-budget:]  # keep the end of the prompt: the part the answer follows
        start = sampling.logprob_start_len
        if sampling.prompt_logprobs and start >= len(ids):
            raise InvalidRequestError(
                f"logprob_start_len: expected a position in the prompt, below its {len(ids)} "
                f"tokens, got {start}"
            )
        arr = np.asarray(ids, dtype=np.int64)
        return Scheduled(
            req.rid, arr, sampling, req.priority, to_context=req.to_context
        ), Tokenized(
            req.rid,
            arr,
            truncated + req.truncated,
            sampling.max_new_tokens if req.to_context else 0,
        )

    def _overflow(self, req: GenerateRequest, size: int, sampling: SamplingParams) -> str:
        if not req.to_context and sampling.max_new_tokens >= self.context_length > 1:
            return no_room_for_prompt(sampling.max_new_tokens, self.context_length)
        if req.to_context:
            return (
                f"the prompt has {size} tokens, which leave no room for an answer in the "
                f"context length {self.context_length}; shorten the prompt"
                + ("" if req.allow_auto_truncate else " or set allow_auto_truncate")
            )
        if size >= self.context_length:
            over = (
                "over the context length"
                if size > self.context_length
                else "the whole context length"  # (no room left for the token it must make)
            )
            return (
                f"the prompt has {size} tokens, {over} {self.context_length} "
                "on its own; shorten the prompt"
                + ("" if req.allow_auto_truncate else " or set allow_auto_truncate")
            )
        # truncating cannot help when max_new_tokens alone fills the context
        advice = (
            "lower max_new_tokens"
            if req.allow_auto_truncate
            else "shorten the prompt, lower max_new_tokens, or set allow_auto_truncate"
        )
        return (
            f"the prompt has {size} tokens and max_new_tokens is {sampling.max_new_tokens}, "
            f"together over the context length {self.context_length}; {advice}"
        )


def encode_each(tokenizer: Any, texts: list[str], add_special: bool) -> list[list[int] | Exception]:
    """Each text's ids, in one tokenizer call; if it raises, text by text, to find the
    texts it fails on: each one's ids, or what encoding it alone raised."""
    try:
        return [list(ids) for ids in tokenizer(texts, add_special_tokens=add_special)["input_ids"]]
    except Exception:
        return [_encode_one(tokenizer, text, add_special) for text in texts]


def _encode_one(tokenizer: Any, text: str, add_special: bool) -> list[int] | Exception:
    try:
        (ids,) = tokenizer([text], add_special_tokens=add_special)["input_ids"]
        return list(ids)
    except Exception as err:
        return untraced(err)


def refuse(rid: str, err: RequestError) -> Refused:
    return Refused(rid, type(err).__name__, str(err))


def unencodable(err: Exception) -> InvalidRequestError:
    return InvalidRequestError(
        f"the tokenizer could not encode the prompt ({type(err).__name__}: {err}); "
        "expected text it can encode, such as valid Unicode without lone surrogates"
    )


E = TypeVar("E", bound=BaseException)


def untraced(err: E) -> E:
    """``err`` without its traceback or the errors it came from, the finished frames
    those tracebacks reach cleared first. A kept error's frames reach the frame of
    the caller that keeps it (a cycle, which held the batch's texts, ~1 GB of a
    tokenizer for 8 MB prompts, till a full collection); Jinja's rewriting of a
    template's traceback leaves a cycle of its own frames whose ``f_back`` reaches
    the caller's too."""
    todo: list[BaseException] = [err]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            frame: FrameType | None = tb.tb_frame
            while frame is not None:
                try:
                    frame.clear()
                except RuntimeError:  # still running: this one's and its callers', ours
                    break
                frame = frame.f_back
            tb = tb.tb_next
        todo += [x for x in (e.__cause__, e.__context__) if x is not None]
        e.__traceback__ = None
    err.__context__ = err.__cause__ = None
    return err


def refusal(rid: str, err: Exception) -> Refused:
    """The refusal of the request whose handling raised ``err``: a RequestError as
    it is; anything else (a bug its input reached) as RequestFailedError, logged."""
    if isinstance(err, RequestError):
        return refuse(rid, err)
    log.error("request %s could not be tokenized", rid, exc_info=err)
    return refuse(
        rid,
        RequestFailedError(f"request {rid} could not be tokenized: {type(err).__name__}: {err}"),
    )

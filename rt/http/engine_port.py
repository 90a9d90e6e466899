"""The engine's stream as the HTTP front consumes it: one :class:`Delta` per
chunk, and the request's counts once its last sequence finished."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rt.outputs import Chunk

TopLogprobs = tuple[tuple[int, float], ...]
# Set while a request that came before the engine's drain is answered: its streams are
# accepted work, which a drain takes (a batch starts its prompts a few at a time; those
# after the drain began were refused, and the whole batch with a 503)
_ACCEPTED = contextvars.ContextVar("rt_http_accepted", default=False)


@contextlib.contextmanager
def answering(engine: Any) -> Iterator[None]:
    """Hold ``engine`` (a drain waits) while answering one request, whose streams,
    if it came before the drain began, the drain takes."""
    with engine.hold():
        token = _ACCEPTED.set(not engine.refusing)
        try:
            yield
        finally:
            _ACCEPTED.reset(token)


@dataclass(frozen=True)
class Delta:
    """What one chunk added to one sequence, with its logprobs when asked for."""

    index: int
    text: str
    output_ids: tuple[int, ...]
    finish_reason: str | None
    matched_stop: int | str | None
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[TopLogprobs, ...] | None = None
    stepped_at: float = 0.0  # when the scheduler made these tokens (time.monotonic())
    prompt: Prompt | None = None  # the prompt's ids and logprobs, once, when asked for


@dataclass(frozen=True)
class Prompt:
    """A prompt's ids, the logprob of each but the first, and their best alternatives."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[TopLogprobs, ...] | None


class EngineStream:
    """``engine.stream(...)`` as :class:`Delta` items; after the last one,
    ``prompt_tokens``, ``cached_tokens`` and ``queue_time`` hold the request's.
    ``aclose()`` (or abandoning it) aborts the request."""

    def __init__(self, engine: Any, prompt: Any, options: dict[str, Any]) -> None:
        self._stream = engine.stream(prompt, **options)  # raises InvalidRequestError
        self._stream.accepted = _ACCEPTED.get()
        self.rid: str = self._stream.rid
        self.completion_tokens = 0

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> Delta:
        chunk: Chunk = await self._stream.__anext__()
        self.completion_tokens += len(chunk.output_ids)
        return Delta(
            chunk.index,
            chunk.text,
            chunk.output_ids,
            chunk.finish_reason,
            chunk.matched_stop,
            chunk.logprobs,
            chunk.top_logprobs,
            chunk.stepped_at,
            None
            if chunk.prompt_logprobs is None or chunk.prompt_ids is None
            else Prompt(chunk.prompt_ids, chunk.prompt_logprobs, chunk.prompt_top_logprobs),
        )

    async def aclose(self) -> None:
        await self._stream.aclose()

    def close(self) -> None:
        """Abort the request now, if the engine has not ended it; what was not read
        is dropped, and the next read ends the stream."""
        self._stream.close()

    async def tokenized(self) -> bool:
        """Wait until the engine has taken the prompt (True), or refused it (False)."""
        return bool(await self._stream.tokenized())

    @property
    def ended(self) -> bool:
        """The engine is done with the request (its chunks may still be unread),
        or the stream is closed."""
        return bool(self._stream.ended)

    @property
    def cut(self) -> bool:
        """Closed before the engine had ended the request."""
        return bool(self._stream.cut)

    @property
    def prompt_tokens(self) -> int:
        meta = self._stream.meta
        return 0 if meta is None else meta.prompt_tokens

    @property
    def kept_ids(self) -> tuple[int, ...] | None:
        """The prompt's ids as the model read them when the engine cut its start
        (``allow_auto_truncate``); None when it kept the whole prompt."""
        meta, ids = self._stream.meta, self._stream.input_ids
        if meta is None or not meta.truncated_tokens or ids is None:
            return None
        return tuple(int(t) for t in ids)

    @property
    def input_ids(self) -> Any:
        """The prompt's ids as the model reads them (an array), from the first chunk on."""
        return self._stream.input_ids

    @property
    def cached_tokens(self) -> int:
        meta = self._stream.meta
        return 0 if meta is None else meta.cached_tokens

    @property
    def queue_time(self) -> float | None:
        """Arrival to the scheduler's first admission."""
        meta = self._stream.meta
        return None if meta is None else meta.queue_time

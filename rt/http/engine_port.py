"""What the HTTP front needs from the engine beyond ``generate`` and ``stream``.

The engine's public surface covers most of it. Where it does not yet, the
need is stated here as an interface, and the front works around it:

* ``Chunk`` carries no logprobs, and a stream reports no prompt or cached
  token counts: :class:`EngineStream` reads them from the engine's request
  table (``engine.table``) while the request is in it, the one place rt/http
  looks inside the engine. Wanted: ``Chunk.logprobs`` / ``Chunk.top_logprobs``
  (the delta's) and ``Stream.meta`` (``rt.outputs.Meta`` once the last
  sequence finished). Both are used as soon as they exist.
* ``/flush_cache`` needs :class:`FlushesCache`, ``/pause_generation`` and
  ``/continue_generation`` :class:`Pauses`; until the engine has them they
  answer 501 and do nothing.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from rt.outputs import Chunk

TopLogprobs = tuple[tuple[int, float], ...]


@runtime_checkable
class FlushesCache(Protocol):
    """What ``/flush_cache`` calls."""

    async def flush_cache(self) -> bool:
        """Drop every prefix-cache entry no request holds. False (and nothing
        done) while requests are running, as SGLang's ``/flush_cache``."""
        ...


@runtime_checkable
class Pauses(Protocol):
    """What ``/pause_generation`` and ``/continue_generation`` call."""

    async def pause_generation(self) -> None:
        """Stop scheduling steps; requests in flight keep their KV and wait,
        new ones are accepted and wait too. Returns once no step runs."""
        ...

    async def continue_generation(self) -> None:
        """Resume after :meth:`pause_generation` (a no-op when not paused)."""
        ...


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


class EngineStream:
    """``engine.stream(...)`` as :class:`Delta` items; after the last one,
    ``prompt_tokens`` and ``cached_tokens`` hold the request's counts.
    ``aclose()`` (or abandoning it) aborts the request."""

    def __init__(self, engine: Any, prompt: Any, options: dict[str, Any]) -> None:
        self._engine = engine
        self._stream = engine.stream(prompt, **options)  # raises InvalidRequestError
        self.rid: str = self._stream.rid
        self._logprobs = bool(options.get("logprobs")) or bool(options.get("top_logprobs"))
        self._sent: defaultdict[int, int] = defaultdict(int)  # tokens delivered, per sequence
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> Delta:
        chunk: Chunk = await self._stream.__anext__()
        start = self._sent[chunk.index]
        self._sent[chunk.index] = start + len(chunk.output_ids)
        self.completion_tokens += len(chunk.output_ids)
        logprobs = getattr(chunk, "logprobs", None)
        top = getattr(chunk, "top_logprobs", None)
        meta = getattr(self._stream, "meta", None)  # wanted: set once every sequence ended
        record = self._record() if meta is None or self._logprobs else None
        if meta is not None:
            self.prompt_tokens, self.cached_tokens = meta.prompt_tokens, meta.cached_tokens
        elif record is not None:
            self.prompt_tokens = record.prompt_tokens
            self.cached_tokens = record.cached_tokens
        if record is not None and self._logprobs and logprobs is None:
            seq = record.seqs[chunk.index]
            end = start + len(chunk.output_ids)
            logprobs = tuple(seq.logprobs[start:end])
            top = tuple(tuple(map(tuple, t)) for t in seq.top_logprobs[start:end])
        return Delta(
            chunk.index,
            chunk.text,
            chunk.output_ids,
            chunk.finish_reason,
            chunk.matched_stop,
            logprobs if self._logprobs else None,
            top if self._logprobs else None,
        )

    async def aclose(self) -> None:
        await self._stream.aclose()

    @property
    def queue_time(self) -> float | None:
        """Arrival to admission by the scheduler, once the engine reports it
        (``Stream.meta.queue_time``, wanted)."""
        meta = getattr(self._stream, "meta", None)
        return getattr(meta, "queue_time", None)

    def _record(self) -> Any:
        """The engine's record of this request (see the module docstring)."""
        try:
            table = self._engine.table
            return table.records.get(table.by_user_rid.get(self.rid))
        except AttributeError:  # said once per process (the warnings filter's default)
            warnings.warn(
                "the engine's request table changed shape: streams get no logprobs or usage",
                RuntimeWarning,
                stacklevel=1,
            )
            return None

"""What the Python API returns: a finished generation, or a streamed chunk."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Meta:
    """Token counts and timings (seconds) of one request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    seed: int | None
    truncated_tokens: int
    time_to_first_token: float | None
    latency: float | None
    # arrival to the scheduler's first admission (the wait for a batch slot and KV)
    queue_time: float | None = None


@dataclass(frozen=True)
class Completion:
    """One output sequence (a request with ``n > 1`` has several)."""

    index: int
    text: str
    output_ids: tuple[int, ...]
    finish_reason: str | None
    matched_stop: int | str | None
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None
    # Where a restarted scheduler, or a resumption after a lost frame, took this sequence
    # over (tokens it already had):
    # what came after each offset was generated conditioned on what came before.
    resumed_from: tuple[int, ...] = ()


@dataclass(frozen=True)
class GenerateOutput:
    """A finished request. ``text``, ``output_ids`` and the rest are those of the
    first sequence; ``choices`` holds every sequence when ``n > 1``."""

    rid: str
    text: str
    output_ids: tuple[int, ...]
    finish_reason: str | None
    matched_stop: int | str | None
    meta: Meta
    choices: tuple[Completion, ...]
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None
    # with prompt_logprobs=True: the prompt's ids, each one's logprob but the first's,
    # and (with top_logprobs) its best alternatives
    prompt_ids: tuple[int, ...] | None = None
    prompt_logprobs: tuple[float, ...] | None = None
    prompt_top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None


@dataclass(frozen=True)
class Chunk:
    """A streamed delta of one sequence: the text and ids new since the last chunk.
    ``finish_reason`` is set on the sequence's last chunk. ``stepped_at`` is
    when the scheduler produced these tokens (``time.monotonic()``, a clock
    shared by every process of the machine), or 0.0 when no step is behind
    them (tokens a restarted detokenizer replays)."""

    rid: str
    index: int
    text: str
    output_ids: tuple[int, ...]
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    stepped_at: float = 0.0
    # each new token's logprob, and its top alternatives, when the request asked for them
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None
    # the prompt's (as GenerateOutput's), on the request's first chunk that has them
    prompt_ids: tuple[int, ...] | None = None
    prompt_logprobs: tuple[float, ...] | None = None
    prompt_top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None

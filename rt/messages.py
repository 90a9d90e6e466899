"""The messages that cross the rings between the frontend and the actors.

Every message names its request (``rid``) and, where it carries tokens or
text, the offset of its first token or character, so that a receiver can
recognise what it has already seen: delivery is at-least-once and every
handler is idempotent. Token ids travel as numpy arrays (one buffer out of
band, not a pickled list of ints).

    frontend ──GenerateRequest──▶ tokenizer ──Scheduled──▶ scheduler
    frontend ◀──Tokenized / Refused── tokenizer
    frontend ──Abort / FinishNow / Scheduled (resubmit)──▶ scheduler
    frontend ──OpenStream / CloseStream──▶ detokenizer
    scheduler ──StepTokens / Refused──▶ detokenizer ──StreamDeltas / Refused──▶ frontend
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rt.detok.incremental import DetokParams
from rt.gpu.sampling_params import SamplingParams

ChatMessage = dict[str, Any]


@dataclass(frozen=True)
class GenerateRequest:
    """A request as the caller made it: exactly one of text, input_ids, messages."""

    rid: str
    text: str | None = None
    input_ids: tuple[int, ...] | None = None
    messages: tuple[ChatMessage, ...] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    detok: DetokParams = field(default_factory=DetokParams)
    allow_auto_truncate: bool = False
    priority: int = 0


@dataclass(frozen=True)
class Scheduled:
    """A tokenized, validated request for the scheduler. ``output_ids`` is
    non-empty when the frontend resubmits a request after a scheduler crash:
    the tokens it already has, with ``sampling.max_new_tokens`` the remaining budget."""

    rid: str
    input_ids: np.ndarray
    sampling: SamplingParams
    priority: int = 0
    output_ids: tuple[np.ndarray, ...] = ()  # per child (n > 1), tokens already generated


@dataclass(frozen=True)
class Tokenized:
    """Tells the frontend the prompt's ids (so it can resubmit without the tokenizer)."""

    rid: str
    input_ids: np.ndarray
    truncated: int = 0  # prompt tokens dropped by allow_auto_truncate


@dataclass(frozen=True)
class Refused:
    """A request that failed alone: validation, admission, or a poison message."""

    rid: str
    error: str  # the rt.errors class name
    message: str


@dataclass(frozen=True)
class Abort:
    rid: str


@dataclass(frozen=True)
class FinishNow:
    """A stop string matched: the scheduler finishes the request and frees its KV."""

    rid: str


@dataclass(frozen=True)
class OpenStream:
    """Start (or, after a detokenizer restart, rebuild) the decode state of a stream."""

    rid: str
    index: int
    prompt_tail: np.ndarray
    detok: DetokParams
    prior_ids: np.ndarray

    @property
    def key(self) -> str:
        return stream_key(self.rid, self.index)


@dataclass(frozen=True)
class CloseStream:
    key: str


@dataclass(frozen=True)
class SeqTokens:
    """New tokens of one sequence from one scheduler step."""

    rid: str
    index: int
    token_offset: int
    ids: np.ndarray
    finish_reason: str | None = None
    matched_stop: int | None = None
    logprobs: np.ndarray | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    seed: int = 0


@dataclass(frozen=True)
class SchedulerStats:
    """The scheduler's state when it last went idle (and its KV check)."""

    steps: int
    running: int
    waiting: int
    request_tokens: int  # KV slots owned by requests
    cached_tokens: int  # KV slots held by the radix cache
    free_tokens: int
    integrity_ok: bool
    retractions: int


@dataclass(frozen=True)
class StepTokens:
    """Everything one scheduler step produced, in one frame."""

    step: int
    seqs: tuple[SeqTokens, ...]
    refused: tuple[Refused, ...] = ()
    stats: SchedulerStats | None = None
    stepped_at: float = 0.0  # time.monotonic() when the step ended (system-wide clock)


@dataclass(frozen=True)
class SeqDelta:
    """Text and tokens of one sequence, as the detokenizer emits them."""

    rid: str
    index: int
    token_offset: int
    ids: np.ndarray
    text_offset: int
    text: str
    finish_reason: str | None = None  # "stop" also when a stop string matched
    matched_stop: int | str | None = None
    logprobs: np.ndarray | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    seed: int = 0


@dataclass(frozen=True)
class StreamDeltas:
    deltas: tuple[SeqDelta, ...]
    refused: tuple[Refused, ...] = ()
    stats: SchedulerStats | None = None
    stepped_at: float = 0.0


def stream_key(rid: str, index: int) -> str:
    return rid if index == 0 else f"{rid}/{index}"

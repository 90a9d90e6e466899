"""The messages that cross the rings between the frontend and the actors.

Every message names its request (``rid``) and, where it carries tokens or
text, the offset of its first token or character, so that a receiver can
recognise what it has already seen: delivery is at-least-once and every
handler is idempotent. Messages are msgspec Structs registered with the
codec: they cross as MessagePack. A prompt's ids travel as a numpy array
(one raw buffer); a step's few new ids per sequence as a tuple of ints,
which MessagePack carries in C (a tiny array would cost a numpy object on
each side: 64 one-token sequences decoded in 120 µs as arrays, see
tools/bench_codec.py).

    frontend ──GenerateRequest──▶ tokenizer ──Scheduled──▶ scheduler
    frontend ◀──Tokenized / Refused── tokenizer
    frontend ──Abort / FinishNow / Scheduled (resubmit)──▶ scheduler
    frontend ──OpenStream / CloseStream──▶ detokenizer
    scheduler ──StepTokens / Refused──▶ detokenizer ──StreamDeltas / Refused──▶ frontend
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from rt.detok.incremental import DetokParams
from rt.gpu.sampling_params import SamplingParams
from rt.shm import codec

ChatMessage = dict[str, Any]


class Message(msgspec.Struct, frozen=True, array_like=True, tag=True, gc=False):
    """The base of every message: immutable, sent as a MessagePack array
    tagged with the class name. Messages hold data, never cycles, so the
    garbage collector need not track them (``gc=False``: cheaper to build)."""


class GenerateRequest(Message, frozen=True):
    """A request as the caller made it: exactly one of text, input_ids, messages."""

    rid: str
    text: str | None = None
    input_ids: tuple[int, ...] | None = None
    messages: tuple[ChatMessage, ...] | None = None
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    detok: DetokParams = msgspec.field(default_factory=DetokParams)
    allow_auto_truncate: bool = False
    priority: int = 0


class Scheduled(Message, frozen=True):
    """A tokenized, validated request for the scheduler. ``output_ids`` is
    non-empty when the frontend resubmits a request after a scheduler crash:
    the tokens it already has, with ``sampling.max_new_tokens`` the remaining budget."""

    rid: str
    input_ids: np.ndarray
    sampling: SamplingParams
    priority: int = 0
    output_ids: tuple[np.ndarray, ...] = ()  # per child (n > 1), tokens already generated


class Tokenized(Message, frozen=True):
    """Tells the frontend the prompt's ids (so it can resubmit without the tokenizer)."""

    rid: str
    input_ids: np.ndarray
    truncated: int = 0  # prompt tokens dropped by allow_auto_truncate


class Refused(Message, frozen=True):
    """A request that failed alone: validation, admission, or a poison message."""

    rid: str
    error: str  # the rt.errors class name
    message: str


class Abort(Message, frozen=True):
    rid: str


class FinishNow(Message, frozen=True):
    """A stop string matched: the scheduler finishes the request and frees its KV."""

    rid: str


class OpenStream(Message, frozen=True):
    """Start (or, after a detokenizer restart, rebuild) the decode state of a stream."""

    rid: str
    index: int
    prompt_tail: np.ndarray
    detok: DetokParams
    prior_ids: np.ndarray

    @property
    def key(self) -> str:
        return stream_key(self.rid, self.index)


class CloseStream(Message, frozen=True):
    key: str


class SeqTokens(Message, frozen=True):
    """New tokens of one sequence from one scheduler step."""

    rid: str
    index: int
    token_offset: int
    ids: tuple[int, ...]
    finish_reason: str | None = None
    matched_stop: int | None = None
    logprobs: tuple[float, ...] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    seed: int = 0


class SchedulerStats(Message, frozen=True):
    """The scheduler's state when it last went idle (and its KV check)."""

    steps: int
    running: int
    waiting: int
    request_tokens: int  # KV slots owned by requests
    cached_tokens: int  # KV slots held by the radix cache
    free_tokens: int
    integrity_ok: bool
    retractions: int


class StepTokens(Message, frozen=True):
    """Everything one scheduler step produced, in one frame."""

    step: int
    seqs: tuple[SeqTokens, ...]
    refused: tuple[Refused, ...] = ()
    stats: SchedulerStats | None = None
    stepped_at: float = 0.0  # time.monotonic() when the step ended (system-wide clock)


class SeqDelta(Message, frozen=True):
    """Text and tokens of one sequence, as the detokenizer emits them."""

    rid: str
    index: int
    token_offset: int
    ids: tuple[int, ...]
    text_offset: int
    text: str
    finish_reason: str | None = None  # "stop" also when a stop string matched
    matched_stop: int | str | None = None
    logprobs: tuple[float, ...] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    seed: int = 0


class StreamDeltas(Message, frozen=True):
    deltas: tuple[SeqDelta, ...]
    refused: tuple[Refused, ...] = ()
    stats: SchedulerStats | None = None
    stepped_at: float = 0.0


def _messages() -> list[type[Message]]:
    return [cls for cls in Message.__subclasses__() if cls.__module__ == __name__]


codec.register(*_messages())


def stream_key(rid: str, index: int) -> str:
    return rid if index == 0 else f"{rid}/{index}"

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
    frontend ──Abort / FinishNow / Scheduled (resubmit) / Control──▶ scheduler
    frontend ──OpenStream / CloseStream──▶ detokenizer
    scheduler ──StepTokens / Refused──▶ detokenizer ──StreamDeltas / Refused──▶ frontend
    detokenizer ──DetokenizerUp (its first frame)──▶ frontend

Every frame a scheduler sends carries its ``epoch`` (its incarnation): after a
scheduler restart the frontend reopens each live stream at the new epoch with
the tokens it holds, and tokens of an older epoch are dropped from then on, so
every output is one that a single run conditioned on its own prefix produced.
A request has *attempts* too: when a frame of its output was lost on the way
(a gap), the frontend resumes that request alone from the tokens it holds, at
its next attempt, and tokens of an older ``(epoch, attempt)`` are dropped the
same way.
A ``rid`` on the rings is the frontend's own (unique per request, never holding
"/"); the caller's rid stays in the frontend's table.
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
    truncated: int = 0  # ids the frontend cut already (past the context length)
    keep_last: int = 0  # truncate_prompt_tokens: at most this many ids, the prompt's last (0: all)
    # max_new_tokens is the room the prompt leaves in the context (the caller gave
    # None: OpenAI's chat default); the tokenizer sets it once it knows the prompt
    to_context: bool = False
    template_kwargs: dict[str, Any] | None = None  # the chat template's variables
    # the tokenizer's special tokens (BOS) added to a text or a rendered chat: None is
    # the default, yes for a text, no for a chat (its template writes them)
    add_special_tokens: bool | None = None


class Scheduled(Message, frozen=True):
    """A tokenized, validated request for the scheduler (from a tokenizer, or
    resubmitted by the frontend after a scheduler crash, with the tokens it holds)."""

    rid: str
    input_ids: np.ndarray
    sampling: SamplingParams
    priority: int = 0
    # A resubmission: per child (n > 1 has several), the tokens it already has. They
    # count against ``sampling.max_new_tokens`` (the original budget); the children
    # named in ``finished`` are done and are not run again.
    output_ids: tuple[np.ndarray, ...] = ()
    finished: tuple[int, ...] = ()
    # the frontend's resumption of this request alone (after a gap in its output): a
    # scheduler holding an older attempt of the rid replaces it with this one
    attempt: int = 0
    # max_new_tokens is the context's room (GenerateRequest.to_context): the core cuts
    # it to the KV pool's where that is smaller, instead of refusing the request
    to_context: bool = False


class Tokenized(Message, frozen=True):
    """Tells the frontend the prompt's ids (so it can resubmit without the tokenizer)."""

    rid: str
    input_ids: np.ndarray
    truncated: int = 0  # prompt tokens dropped by allow_auto_truncate
    max_new_tokens: int = 0  # the budget a to_context request got (0: the one it asked for)


class Refused(Message, frozen=True):
    """A request that failed alone: validation, admission, or a poison message."""

    rid: str
    error: str  # the rt.errors class name
    message: str


class Abort(Message, frozen=True):
    rid: str
    # False: also stop it if it arrives later (a tombstone); True: only if it runs now
    # (for output of a request that already left the frontend's table)
    if_running: bool = False


class FinishNow(Message, frozen=True):
    """A stop string matched: the scheduler finishes the request and frees its KV;
    with ``index``, only that sample of it (the others go on)."""

    rid: str
    index: int | None = None


class Control(Message, frozen=True):
    """An operator's command to the scheduler, applied between two steps and
    acknowledged by a stats report (``SchedulerStats.control == seq``):
    ``"pause"`` (no step runs until ``"continue"``; requests keep their KV),
    ``"continue"``, ``"flush_cache"`` (drop the prefix cache, only when no
    request is in the scheduler: ``control_ok`` says whether it was done).
    ``seq`` numbers the frontend's commands; applying one twice is harmless."""

    op: str
    seq: int


class OpenStream(Message, frozen=True):
    """Start (or, after an actor restart, rebuild) the decode state of a stream:
    ``prior_ids`` are the tokens the frontend holds, and from now on only tokens
    of scheduler ``epoch`` (or later, once reopened at it) count."""

    rid: str
    index: int
    prompt_tail: np.ndarray
    detok: DetokParams
    prior_ids: np.ndarray
    epoch: int = 0
    attempt: int = 0  # the request's attempt (see Scheduled.attempt)

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
    admitted_at: float = 0.0  # when the scheduler first admitted it (time.monotonic())
    # the prompt's logprobs, with the first token of a request that asked for them
    prompt_logprobs: tuple[float, ...] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]]] | None = None
    attempt: int = 0  # the request's attempt these tokens belong to


# Busy, the scheduler's report rides on a step's frame this often (without the KV
# integrity walk, which waits for idle): /server_info and /metrics froze under load.
BUSY_REPORT_EVERY_S = 1.0


class SchedulerStats(Message, frozen=True):
    """The scheduler's state when it last went idle (and its KV check)."""

    steps: int
    running: int
    waiting: int
    request_tokens: int  # KV slots running requests hold (their cached prefixes too)
    cached_tokens: int  # KV slots the radix cache alone holds (evictable)
    free_tokens: int
    integrity_ok: bool
    retractions: int
    requests: int = 0  # per-request records the scheduler actor holds (0 when all ended)
    paused: bool = False  # generation paused by a Control
    control: int = 0  # the seq of the last Control applied (0: none this incarnation)
    control_ok: bool = True  # whether that Control did what it asked
    last_gen_throughput: float = 0.0  # tokens/s of recent decode steps (SGLang's name)


class StepTokens(Message, frozen=True):
    """Everything one scheduler step produced, in one frame."""

    step: int
    seqs: tuple[SeqTokens, ...]
    refused: tuple[Refused, ...] = ()
    stats: SchedulerStats | None = None
    stepped_at: float = 0.0  # time.monotonic() when the step ended (system-wide clock)
    epoch: int = 0  # the scheduler's incarnation


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
    epoch: int = 0  # the scheduler epoch of its tokens
    admitted_at: float = 0.0  # when the scheduler first admitted it (time.monotonic())
    prompt_logprobs: tuple[float, ...] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]]] | None = None
    attempt: int = 0  # the request's attempt of its tokens


class DetokStats(Message, frozen=True):
    """What the detokenizer holds: open streams, and step records parked for a
    stream not open (yet) at their epoch. Both are 0 once every request ended."""

    streams: int
    parked: int


class StreamDeltas(Message, frozen=True):
    deltas: tuple[SeqDelta, ...]
    refused: tuple[Refused, ...] = ()
    stats: SchedulerStats | None = None
    stepped_at: float = 0.0
    unknown: tuple[str, ...] = ()  # stream keys with parked tokens and no open: close or open?
    detok: DetokStats | None = None
    # streams whose tokens came with a gap before them (a lost frame), with the
    # (epoch, attempt) they came at: the frontend resumes those requests
    gaps: tuple[tuple[str, int, int], ...] = ()


class DetokenizerUp(Message, frozen=True):
    """A detokenizer's first frame: everything before it in the ring is its
    predecessor's; the frontend reopens every live stream when it reads this."""

    incarnation: int


def _messages() -> list[type[Message]]:
    return [cls for cls in Message.__subclasses__() if cls.__module__ == __name__]


codec.register(*_messages())


def stream_key(rid: str, index: int) -> str:
    """The detokenizer's name for one sequence. Unique because ring rids never hold "/"."""
    return f"{rid}/{index}"

"""Per-request sampling parameters and their validation."""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from rt.errors import InvalidRequestError

SEED_MASK = (1 << 63) - 1
GREEDY_BELOW = 1e-5
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
FLOAT32_MAX = 3.4028234663852886e38
MAX_N = 1024  # samples per request


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request.

    ``temperature=0`` is greedy. ``top_k<=0``, ``top_p=1`` and ``min_p=0`` disable
    their filter. ``max_new_tokens`` and ``min_new_tokens`` count tokens produced
    by this submission (a resume passes the remaining budget). ``seed=None``
    draws a seed at admission; the output reports it so a resume can reuse it.
    ``logprobs`` asks for the chosen tokens' log-probabilities under the model
    (log-softmax of the raw logits) and ``top_logprobs`` for that many best.
    ``prompt_logprobs`` asks for each prompt token's (but the first's), and
    its ``top_logprobs`` best, from the prefill (which then skips the prefix cache);
    ``logprob_start_len`` is the first prompt position the caller reads them from
    (SGLang's field; the HTTP API reports from it): a prompt with no such
    position is refused once tokenized. ``allowed_token_ids`` (vLLM's): only
    these ids may be drawn (None: any); the logprobs stay the model's.
    """

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    n: int = 1
    seed: int | None = None
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    allowed_token_ids: tuple[int, ...] | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: bool = False
    logprob_start_len: int = 0

    @property
    def greedy(self) -> bool:
        # As SGLang does: a temperature this small is greedy (dividing by it
        # would overflow float32 logits and pick a wrong token).
        return self.temperature < GREEDY_BELOW

    @property
    def has_penalties(self) -> bool:
        return (
            self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    def validate(self, vocab_size: int) -> None:
        """Raise InvalidRequestError naming the first bad field, what it expects and what it got."""
        _int_in("max_new_tokens", self.max_new_tokens, 1, None)
        _int_in("min_new_tokens", self.min_new_tokens, 0, self.max_new_tokens)
        _float_in("temperature", self.temperature, 0.0, None)
        _int_in("top_k", self.top_k, None, None)
        _float_in("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _float_in("min_p", self.min_p, 0.0, 1.0)
        _float_in("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _float_in("presence_penalty", self.presence_penalty, -2.0, 2.0)
        # below 1e-6 it overflowed float32 in the sampler (logits / penalty: inf, NaN, token
        # 0 every step); a penalty that small already makes every seen token certain
        _float_in("repetition_penalty", self.repetition_penalty, REPETITION_PENALTY_MIN, None)
        _int_in("n", self.n, 1, MAX_N)
        _int_in("top_logprobs", self.top_logprobs, 0, min(vocab_size, 1024))
        _bool("ignore_eos", self.ignore_eos)
        _bool("logprobs", self.logprobs)
        _bool("prompt_logprobs", self.prompt_logprobs)
        _int_in("logprob_start_len", self.logprob_start_len, 0, None)
        if self.seed is not None:
            _int_in("seed", self.seed, 0, SEED_MASK)
        if not isinstance(self.stop_token_ids, tuple | list):
            raise InvalidRequestError(
                f"stop_token_ids: expected a list of token ids, got {show(self.stop_token_ids)}"
            )
        for tok in self.stop_token_ids:
            _token("stop_token_ids", tok, vocab_size)
        if self.allowed_token_ids is not None:
            if not isinstance(self.allowed_token_ids, tuple | list):
                raise InvalidRequestError(
                    "allowed_token_ids: expected a list of token ids, "
                    f"got {show(self.allowed_token_ids)}"
                )
            if not self.allowed_token_ids:  # (nothing could be drawn)
                raise InvalidRequestError(
                    "allowed_token_ids: expected at least one token id, got an empty list"
                )
            for tok in self.allowed_token_ids:
                _token("allowed_token_ids", tok, vocab_size)
        if not isinstance(self.logit_bias, Mapping):
            raise InvalidRequestError(
                f"logit_bias: expected a mapping token id → bias, got {show(self.logit_bias)}"
            )
        for tok, bias in self.logit_bias.items():
            _token("logit_bias", tok, vocab_size)
            _float_in(f"logit_bias[{tok}]", bias, -100.0, 100.0)


def show(value: object) -> str:
    """``value`` for an error message: short, and safe for any value (``repr`` of
    an integer past 4,300 digits raises, and a caller's list may be huge)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlong = 40


def _bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{name}: expected true or false, got {show(value)}")


def _int_in(name: str, value: object, low: int | None, high: int | None) -> None:
    """An integer in [low, high]; an open end still means 64 bits (the rings carry
    MessagePack integers, the sampler torch's int64)."""
    if isinstance(value, bool) or not isinstance(value, int):
        hint = _convert(value, numbers.Integral, "a Python int", "int")
        raise InvalidRequestError(f"{name}: expected an integer{hint}, got {show(value)}")
    low = INT64_MIN if low is None else low
    high = INT64_MAX if high is None else high
    if not low <= value <= high:
        raise InvalidRequestError(
            f"{name}: expected an integer in [{low}, {high}], got {show(value)}"
        )


REPETITION_PENALTY_MIN = 1e-6


def _convert(value: object, kind: type, wanted: str, builtin: str) -> str:
    """A hint for a number of another library's type (numpy's float32, say): it
    is a number, just not one the engine takes as it is."""
    if isinstance(value, kind) and not isinstance(value, bool):
        return f" ({wanted}: convert this one with {builtin}())"
    return ""


def _float_in(
    name: str, value: object, low: float | None, high: float | None, low_open: bool = False
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        hint = _convert(value, numbers.Real, "a Python int or float", "float")
        raise InvalidRequestError(f"{name}: expected a finite number{hint}, got {show(value)}")
    try:
        number = float(value)  # what the sampler will hold; an int past 1e308 has none
    except OverflowError:
        raise InvalidRequestError(
            f"{name}: expected a finite number, got {show(value)}, too large for a float"
        ) from None
    if not math.isfinite(number):
        raise InvalidRequestError(f"{name}: expected a finite number, got {show(value)}")
    if abs(number) > FLOAT32_MAX:  # inf in the sampler's tensors: NaN logits, garbage tokens
        raise InvalidRequestError(
            f"{name}: expected a number of magnitude at most {FLOAT32_MAX:.7g} (the sampler "
            f"computes in float32), got {show(value)}"
        )
    too_low = low is not None and (number <= low if low_open else number < low)
    if too_low or (high is not None and number > high):
        if high is None:
            wanted = f"a number {'>' if low_open else '>='} {low:g}"
        else:
            wanted = f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"
        raise InvalidRequestError(f"{name}: expected {wanted}, got {show(value)}")


def _token(name: str, value: object, vocab_size: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise InvalidRequestError(
            f"{name}: expected token ids in [0, {vocab_size}), got {show(value)}"
        )

"""Per-request sampling parameters and their validation."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from rt.errors import InvalidRequestError

SEED_MASK = (1 << 63) - 1


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request.

    ``temperature=0`` is greedy. ``top_k<=0``, ``top_p=1`` and ``min_p=0`` disable
    their filter. ``max_new_tokens`` and ``min_new_tokens`` count tokens produced
    by this submission (a resume passes the remaining budget). ``seed=None``
    draws a seed at admission; the output reports it so a resume can reuse it.
    ``logprobs`` asks for the chosen tokens' log-probabilities under the model
    (log-softmax of the raw logits) and ``top_logprobs`` for that many best.
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
    logprobs: bool = False
    top_logprobs: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

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
        _float_in("repetition_penalty", self.repetition_penalty, 0.0, None, low_open=True)
        _int_in("n", self.n, 1, 1024)
        _int_in("top_logprobs", self.top_logprobs, 0, min(vocab_size, 1024))
        _bool("ignore_eos", self.ignore_eos)
        _bool("logprobs", self.logprobs)
        if self.seed is not None:
            _int_in("seed", self.seed, 0, SEED_MASK)
        for tok in self.stop_token_ids:
            _token("stop_token_ids", tok, vocab_size)
        if not isinstance(self.logit_bias, Mapping):
            raise InvalidRequestError(
                f"logit_bias: expected a mapping token id → bias, got {type(self.logit_bias).__name__}"
            )
        for tok, bias in self.logit_bias.items():
            _token("logit_bias", tok, vocab_size)
            _float_in(f"logit_bias[{tok}]", bias, -100.0, 100.0)


def _bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{name}: expected true or false, got {value!r}")


def _int_in(name: str, value: object, low: int | None, high: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name}: expected an integer, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise InvalidRequestError(f"{name}: expected an integer in [{low}, {high}], got {value}")


def _float_in(
    name: str, value: object, low: float | None, high: float | None, low_open: bool = False
) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequestError(f"{name}: expected a finite number, got {value!r}")
    too_low = low is not None and (value <= low if low_open else value < low)
    if too_low or (high is not None and value > high):
        bracket = "(" if low_open else "["
        raise InvalidRequestError(
            f"{name}: expected a number in {bracket}{low}, {high}], got {value}"
        )


def _token(name: str, value: object, vocab_size: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise InvalidRequestError(f"{name}: expected token ids in [0, {vocab_size}), got {value!r}")

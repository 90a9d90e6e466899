"""bench_serving's requests, pure: their lengths, random-token prompts that
re-encode to their length, Poisson arrivals, the completion body each server
flavor takes, and an SSE line's data (tools/bench_serving.py sends them)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RequestSpec:
    prompt: str
    prompt_len: int  # tokens, as this tool's tokenizer counts them (no special tokens)
    output_len: int


def sample_lengths(n: int, length: int, range_ratio: float, rng: random.Random) -> list[int]:
    """``n`` lengths uniform in [round(length × range_ratio), length]; all
    ``length`` when ``range_ratio`` is 1."""
    if not 0 < range_ratio <= 1:
        raise ValueError(f"range_ratio must be in (0, 1], got {range_ratio}")
    low = max(1, round(length * range_ratio))
    return [rng.randint(low, length) for _ in range(n)]


def fit_prompt(
    ids: Sequence[int], encode: Callable[[str], list[int]], decode: Callable[[list[int]], str]
) -> tuple[str, int]:
    """A text that encodes to at most ``len(ids)`` tokens, and its length:
    random ids decoded then encoded again merge and split, so trim and retry."""
    target, text = len(ids), decode(list(ids))
    for _ in range(4):
        again = encode(text)
        if len(again) <= target:
            return text, len(again)
        text = decode(again[:target])
    return text, len(encode(text))


def make_requests(
    n: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    seed: int,
    vocab: Sequence[int],
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    prompt_seed: int | None = None,
) -> list[RequestSpec]:
    """Prompts of random tokens from ``vocab`` (no prefix shared by design). The
    lengths come from ``seed``, the tokens from ``prompt_seed`` (default: ``seed``):
    runs given the same seed and prompt seeds of their own ask for the same lengths."""
    rng = random.Random(seed)
    inputs = sample_lengths(n, input_len, range_ratio, rng)
    outputs = sample_lengths(n, output_len, range_ratio, rng)
    if prompt_seed is not None:
        rng = random.Random(prompt_seed)
    specs = []
    for in_len, out_len in zip(inputs, outputs, strict=True):
        text, actual = fit_prompt([rng.choice(vocab) for _ in range(in_len)], encode, decode)
        specs.append(RequestSpec(text, actual, out_len))
    return specs


def arrival_offsets(n: int, rate: float, rng: random.Random) -> list[float]:
    """When each request is sent, in seconds from the start: a Poisson process
    of ``rate`` requests/s (exponential gaps, the first at 0); all at 0 when
    ``rate`` is infinite."""
    if rate <= 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    if math.isinf(rate):
        return [0.0] * n
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def completion_body(
    flavor: str, model: str | None, spec: RequestSpec, extra: dict[str, Any]
) -> dict[str, Any]:
    """The /v1/completions body. Every flavor asks for exactly ``output_len``
    tokens in its server's own way: ``rt`` (also vLLM's and SGLang's) with
    ``ignore_eos``; ``transformers`` with a generation config (its server
    refuses fields it does not know, 422); ``plain`` (the OpenAI API) cannot,
    and a request may end early at EOS."""
    body: dict[str, Any] = {"prompt": spec.prompt, "max_tokens": spec.output_len, "stream": True}
    if model is not None:
        body["model"] = model
    if flavor == "rt":
        body.update(temperature=0.0, ignore_eos=True, stream_options={"include_usage": True})
    elif flavor == "transformers":
        config = {"max_new_tokens": spec.output_len, "min_new_tokens": spec.output_len}
        body["generation_config"] = json.dumps({**config, "do_sample": False})
    elif flavor == "plain":
        body.update(temperature=0.0, stream_options={"include_usage": True})
    else:
        raise ValueError(f"flavor must be rt, transformers or plain, got {flavor!r}")
    return {**body, **extra}


@dataclass(frozen=True)
class Workload:
    specs: list[RequestSpec]  # measured
    warmup: list[RequestSpec]  # other prompts, sent before each run, not measured
    warmup_count: int | None  # None: as many as the run's concurrency
    rate: float
    seed: int


def sse_data(line: str) -> str | None:
    """The payload of an SSE ``data:`` line; None for any other line."""
    if not line.startswith("data:"):
        return None
    return line[5:].lstrip(" ")

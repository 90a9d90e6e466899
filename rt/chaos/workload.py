"""The load: request ``i`` of seed ``s`` is a pure function of ``(s, i)``.

Greedy and seeded requests of mixed lengths over the transports asked for,
some cancelled after a few deltas (politely: a cancel; or rudely: the client
goes away), and hostile ones: poison (text carrying a marker that a poison
fault of the schedule crashes its tokenizer on, or token ids that one
crashes the scheduler on), invalid (parameters or
text rt must refuse with a clear 4xx) and, over HTTP, fuzzed bodies.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, replace
from typing import Any

TRANSPORTS = ("engine", "sse", "ws")
TEXT = (
    "In the beginning God created the heaven and the earth. And the earth was without "
    "form, and void; and darkness was upon the face of the deep. And the Spirit of God "
    "moved upon the face of the waters. And God said, Let there be light: and there was "
    "light. And God saw the light, that it was good: and God divided the light from the "
    "darkness."
)
WORDS = re.findall(r"\w+", TEXT)
# Requests rt must refuse, as (engine keyword options, what is wrong).
INVALID: tuple[dict[str, Any], ...] = (
    {"prompt": "lone \ud800 surrogate", "max_new_tokens": 4},
    {"prompt": "stop", "stop": 5, "max_new_tokens": 4},
    {"prompt": "bias", "logit_bias": {"x": 1.0}, "max_new_tokens": 4},
    {"prompt": "negative", "max_new_tokens": -3},
    {"prompt": "temperature", "temperature": -1.0, "max_new_tokens": 4},
    {"prompt": "top_p", "top_p": 7.5, "max_new_tokens": 4},
)


@dataclass(frozen=True)
class WorkloadConfig:
    transports: tuple[str, ...] = ("engine",)
    max_tokens: tuple[int, int] = (8, 40)
    long_prompt_share: float = 0.1  # prompts of a few hundred tokens (a longer prefill)
    cancel_share: float = 0.1
    disconnect_share: float = 0.5  # of the cancelled: by going away, not a polite cancel
    invalid_share: float = 0.0
    fuzz_share: float = 0.0  # HTTP transports only
    poison_markers: tuple[str, ...] = ()
    poison_at: float = 0.3  # where in the first requests the poison flood starts (a share)
    poison_span: int = 40  # the flood lands within the first this many requests
    seeded_share: float = 0.5
    seeded_temperature: float = 0.8  # and top_p 0.95: the seeded requests' sampling


@dataclass(frozen=True)
class RequestSpec:
    """One request. ``hostile``: None, "poison", "invalid" or "fuzz"."""

    index: int
    transport: str
    prompt: str
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stream: bool = True  # deltas as they come (else the whole output at the end)
    cancel_after: int | None = None  # deltas received, then cancel
    disconnect: bool = False  # cancel by going away instead of a polite cancel
    hostile: str | None = None
    marker: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # invalid/fuzzed fields
    prompt_ids: tuple[int, ...] | None = None  # sent as token ids instead of ``prompt``

    @property
    def checked(self) -> bool:
        """Whether its output has a reference to equal (greedy or seeded, innocent)."""
        return self.hostile is None

    def options(self) -> dict[str, Any]:
        """The keyword options of ``engine.generate`` / ``engine.stream``."""
        opts: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "ignore_eos": True,
            "temperature": self.temperature,
        }
        if self.temperature > 0:
            opts.update(top_p=self.top_p, seed=self.seed)
        opts.update(self.extra)
        return opts

    def sampling_params(self) -> dict[str, Any]:
        """``sampling_params`` of ``/generate``."""
        return self.options()

    def engine_prompt(self) -> str | list[int]:
        """The prompt as ``engine.generate`` takes it: text, or token ids."""
        return self.prompt if self.prompt_ids is None else list(self.prompt_ids)

    def body(self) -> dict[str, Any]:
        """The ``/generate`` (and WebSocket ``generate``) body, but for ``stream``."""
        prompt: dict[str, Any] = (
            {"text": self.prompt}
            if self.prompt_ids is None
            else {"input_ids": list(self.prompt_ids)}
        )
        return {**prompt, "sampling_params": self.sampling_params()}


def draw_request(seed: int, index: int, config: WorkloadConfig) -> RequestSpec:
    rng = random.Random(f"{seed}/request/{index}")
    transport = rng.choice(config.transports)
    words = rng.sample(WORDS, rng.randint(3, 12))
    if rng.random() < config.long_prompt_share:
        words = [rng.choice(WORDS) for _ in range(rng.randint(150, 300))]
    prompt = " ".join(words)
    max_new = rng.randint(*config.max_tokens)
    temperature, top_p, sample_seed = 0.0, 1.0, None
    if rng.random() < config.seeded_share:
        temperature, top_p = config.seeded_temperature, 0.95
        sample_seed = rng.randrange(1 << 31)
    stream = transport == "ws" or rng.random() < 0.7
    cancel_after, disconnect = None, False
    if rng.random() < config.cancel_share:
        cancel_after, disconnect = rng.randint(1, 4), rng.random() < config.disconnect_share
    spec = RequestSpec(
        index,
        transport,
        prompt,
        max_new,
        temperature,
        top_p,
        sample_seed,
        stream,
        cancel_after,
        disconnect,
    )
    marker = _poison_marker(index, config)
    if marker is not None and marker.startswith(" "):  # the scheduler's: token ids
        ids = (
            *(rng.randrange(3, 64) for _ in range(rng.randint(2, 10))),
            *map(int, marker.split()),
        )
        return replace(
            spec,
            prompt=f"token ids {list(ids)}",
            prompt_ids=ids,
            hostile="poison",
            marker=marker,
            cancel_after=None,
        )
    if marker is not None:
        return replace(
            spec, prompt=f"{prompt} {marker}", hostile="poison", marker=marker, cancel_after=None
        )
    roll = rng.random()
    if roll < config.invalid_share:
        # rt.client encodes with msgspec, which refuses a lone surrogate itself
        bad = dict(rng.choice(INVALID[1:] if transport == "ws" else INVALID))
        return replace(
            spec, prompt=bad.pop("prompt"), hostile="invalid", extra=bad, cancel_after=None
        )
    if transport != "engine" and roll < config.invalid_share + config.fuzz_share:
        return replace(spec, hostile="fuzz", extra={"body": fuzz_body(rng)}, cancel_after=None)
    return spec


def _poison_marker(index: int, config: WorkloadConfig) -> str | None:
    """The flood: the k-th marker goes to request ``start + k`` (back to back)."""
    markers = config.poison_markers
    if not markers:
        return None
    start = int(config.poison_at * config.poison_span)
    k = index - start
    return markers[k] if 0 <= k < len(markers) else None


def fuzz_body(rng: random.Random) -> dict[str, Any]:
    """A ``/generate`` body with a few fields of the wrong type or out of range."""
    junk: list[Any] = [None, -1, 2**63, 1e308, "x" * rng.randint(0, 40), [], {}, True, [1, "a"]]
    body: dict[str, Any] = {"text": rng.choice(["ok", "", 5, ["a", 3], None])}
    sampling = {
        name: rng.choice(junk)
        for name in rng.sample(
            ["max_new_tokens", "temperature", "top_p", "top_k", "stop", "n", "seed", "logit_bias"],
            rng.randint(1, 3),
        )
    }
    body["sampling_params"] = sampling if rng.random() < 0.8 else rng.choice(junk)
    if rng.random() < 0.3:
        body[rng.choice(["rid", "stream", "input_ids", "bogus_field"])] = rng.choice(junk)
    return body

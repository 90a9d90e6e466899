"""Stop strings over a stream of text deltas.

Text that could still turn out to be the start of a stop string is held back,
so nothing at or after a stop string is ever emitted, even when the stop
string spans several deltas (several tokens).

Each stop string is followed through the text by Knuth–Morris–Pratt: how much
of it the text ends with, moved on one character at a time through its
failure table. A character costs O(1) a stop string, amortized, whatever
their lengths, and a table 4 bytes a character (an Aho–Corasick automaton of
them all, moved once a character, costs ~250 bytes of Python objects a
character: 17 MB for the stop strings one request may have).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from functools import lru_cache


def _failure(stop: str) -> array[int]:
    """``fail[i]``: the length of the longest proper prefix of ``stop[: i + 1]``
    that is also a suffix of it."""
    fail = array("i", bytes(4 * len(stop)))
    k = 0
    for i in range(1, len(stop)):
        ch = stop[i]
        while k and stop[k] != ch:
            k = fail[k - 1]
        if stop[k] == ch:
            k += 1
        fail[i] = k
    return fail


@lru_cache(maxsize=64)  # a request's n samples, and requests alike, share them
def _tables(stops: tuple[str, ...]) -> tuple[array[int], ...]:
    return tuple(_failure(stop) for stop in stops)


@dataclass
class StopMatcher:
    stops: tuple[str, ...]
    keep: bool = False  # the stop string matched stays in the text (no_stop_trim)
    held: str = field(default="", init=False)
    matched: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if any(not s for s in self.stops):
            raise ValueError("a stop string must not be empty")
        self.stops = tuple(self.stops)
        self._fail = _tables(self.stops)
        self._ends = [0] * len(self.stops)  # how much of each stop string the text ends with

    def feed(self, delta: str) -> str:
        """The part of ``delta`` (after any held text) that is safe to emit.
        After a match, ``matched`` names the stop string and nothing more is emitted."""
        if self.matched is not None:
            return ""
        text = self.held + delta
        if not self.stops:
            return text
        if self._read(delta):  # a stop string ends in it: the earliest to start wins
            cut, hit = min((text.find(s), s) for s in self.stops if s in text)
            self.matched, self.held = hit, ""
            return text[: cut + len(hit)] if self.keep else text[:cut]
        keep = max(self._ends, default=0)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """At the end of generation: whatever was held is not a stop string after all."""
        text, self.held = ("" if self.matched is not None else self.held), ""
        self._ends = [0] * len(self.stops)  # (nothing held: a stop string starts afresh)
        return text

    def _read(self, delta: str) -> bool:
        """Follow each stop string through ``delta``; whether one ends in it."""
        ends = self._ends
        for i, (stop, fail) in enumerate(zip(self.stops, self._fail, strict=True)):
            k, n = ends[i], len(stop)
            start = 0 if k else delta.find(stop[0])  # (most deltas hold no stop's start)
            if start < 0:
                continue
            for ch in delta[start:] if start else delta:
                while k and stop[k] != ch:
                    k = fail[k - 1]
                if stop[k] == ch:
                    k += 1
                    if k == n:
                        return True
            ends[i] = k
        return False

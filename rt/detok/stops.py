"""Stop strings over a stream of text deltas.

Text that could still turn out to be the start of a stop string is held back,
so nothing at or after a stop string is ever emitted, even when the stop
string spans several deltas (several tokens).

The text is read through an Aho–Corasick automaton of the request's stop
strings, one character at a time: its state is the longest suffix of the text
read that begins some stop string (what is held back), and says when one ends.
A character costs O(1), amortized, whatever the number and length of the stop
strings. (The suffix used to be found by trying each stop string's prefixes
against the text: O(Σ L²) a token, 8 ms a token and sequence for 64 stop strings
of 1,024 characters, which held up every other request's output.)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache


class _Automaton:
    """Aho–Corasick over ``stops``: state 0 is the root; ``depth[s]`` is the length
    of the prefix state ``s`` stands for, ``ends[s]`` whether a stop string is a
    suffix of it."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.goto: list[dict[str, int]] = [{}]
        self.fail, self.depth, self.ends = [0], [0], [False]
        for stop in stops:
            state = 0
            for ch in stop:
                nxt = self.goto[state].get(ch)
                if nxt is None:
                    nxt = len(self.goto)
                    self.goto[state][ch] = nxt
                    self.goto.append({})
                    self.fail.append(0)
                    self.depth.append(self.depth[state] + 1)
                    self.ends.append(False)
                state = nxt
            self.ends[state] = True
        queue = deque(self.goto[0].values())  # breadth first: a fail link is shallower
        while queue:
            state = queue.popleft()
            for ch, nxt in self.goto[state].items():
                queue.append(nxt)
                self.fail[nxt] = self.step(self.fail[state], ch)
                self.ends[nxt] = self.ends[nxt] or self.ends[self.fail[nxt]]

    def step(self, state: int, ch: str) -> int:
        goto, fail = self.goto, self.fail
        while state and ch not in goto[state]:
            state = fail[state]
        return goto[state].get(ch, 0)

    def read(self, state: int, text: str) -> tuple[int, bool]:
        """The state after ``text`` from ``state``, and whether a stop string ended in
        it (the state is then the one where it ended: nothing after is read)."""
        goto, fail, ends = self.goto, self.fail, self.ends
        for ch in text:  # (step(), inlined: this runs for every character generated)
            while state and ch not in goto[state]:
                state = fail[state]
            state = goto[state].get(ch, 0)
            if ends[state]:
                return state, True
        return state, False


@lru_cache(maxsize=64)  # a request's n samples, and requests alike, share one
def _automaton(stops: tuple[str, ...]) -> _Automaton:
    return _Automaton(stops)


@dataclass
class StopMatcher:
    stops: tuple[str, ...]
    held: str = ""
    keep: bool = False  # the stop string matched stays in the text (no_stop_trim)
    matched: str | None = field(default=None, init=False)
    _state: int = field(default=0, init=False)  # the automaton's, after ``held``

    def __post_init__(self) -> None:
        if any(not s for s in self.stops):
            raise ValueError("a stop string must not be empty")
        self.stops = tuple(self.stops)
        self._automaton = _automaton(self.stops) if self.stops else None
        if self._automaton is not None:
            self._state = self._automaton.read(0, self.held)[0]

    def feed(self, delta: str) -> str:
        """The part of ``delta`` (after any held text) that is safe to emit.
        After a match, ``matched`` names the stop string and nothing more is emitted."""
        if self.matched is not None:
            return ""
        text = self.held + delta
        if self._automaton is None:
            self.held = ""
            return text
        self._state, ended = self._automaton.read(self._state, delta)
        if ended:  # a stop string ends in it: the earliest to start wins
            cut, hit = min((text.find(s), s) for s in self.stops if s in text)
            self.matched, self.held = hit, ""
            return text[: cut + len(hit)] if self.keep else text[:cut]
        keep = self._automaton.depth[self._state]
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """At the end of generation: whatever was held is not a stop string after all."""
        text, self.held = ("" if self.matched is not None else self.held), ""
        return text

"""Stop strings over a stream of text deltas.

Text that could still turn out to be the start of a stop string is held back,
so nothing at or after a stop string is ever emitted, even when the stop
string spans several deltas (several tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StopMatcher:
    stops: tuple[str, ...]
    held: str = ""
    keep: bool = False  # the stop string matched stays in the text (no_stop_trim)
    matched: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if any(not s for s in self.stops):
            raise ValueError("a stop string must not be empty")

    def feed(self, delta: str) -> str:
        """The part of ``delta`` (after any held text) that is safe to emit.
        After a match, ``matched`` names the stop string and nothing more is emitted."""
        if self.matched is not None:
            return ""
        text = self.held + delta
        if not self.stops:
            self.held = ""
            return text
        cut, hit = min(((text.find(s), s) for s in self.stops if s in text), default=(-1, None))
        if hit is not None:
            self.matched, self.held = hit, ""
            return text[: cut + len(hit)] if self.keep else text[:cut]
        keep = self._partial_suffix(text)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """At the end of generation: whatever was held is not a stop string after all."""
        text, self.held = ("" if self.matched is not None else self.held), ""
        return text

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best

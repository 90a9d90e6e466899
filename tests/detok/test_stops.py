from __future__ import annotations

import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rt.detok.stops import StopMatcher


def test_text_that_may_start_a_stop_string_is_held_back() -> None:
    m = StopMatcher(("STOP",))
    assert m.feed("abc ST") == "abc "
    assert m.feed("O") == ""
    assert m.feed("x") == "STOx"
    assert m.feed("S") == ""
    assert m.feed("TOP and more") == ""
    assert m.matched == "STOP"
    assert m.feed("ignored") == "" and m.flush() == ""


def test_no_stop_trim_keeps_the_stop_string_and_nothing_after_it() -> None:
    m = StopMatcher(("STOP",), keep=True)
    assert m.feed("abc ST") == "abc "
    assert m.feed("OP and more") == "STOP"
    assert m.matched == "STOP" and m.flush() == ""


def test_the_earliest_stop_string_wins() -> None:
    m = StopMatcher(("world", "lo w"))
    assert m.feed("hello world") == "hel"
    assert m.matched == "lo w"


def test_held_text_is_released_at_the_end() -> None:
    m = StopMatcher(("\n\n",))
    assert m.feed("line\n") == "line"
    assert m.flush() == "\n"
    assert m.feed("\nmore") == "\nmore"  # (what was held is gone: no stop string spans it)


def test_no_stop_strings_passes_everything() -> None:
    m = StopMatcher(())
    assert m.feed("anything") == "anything" and m.flush() == ""


def test_empty_stop_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        StopMatcher(("",))


class Reference:
    """The matcher by definition: hold the longest suffix of the text that is a
    proper prefix of a stop string; at the first stop string (the earliest to
    start), emit what comes before it (with it: keep)."""

    def __init__(self, stops: tuple[str, ...], keep: bool) -> None:
        self.stops, self.keep, self.held, self.matched = stops, keep, "", None

    def feed(self, delta: str) -> str:
        if self.matched is not None:
            return ""
        text = self.held + delta
        found = [(text.find(s), s) for s in self.stops if s in text]
        if found:
            cut, self.matched = min(found)
            self.held = ""
            return text[: cut + len(self.matched)] if self.keep else text[:cut]
        keep = max(
            (n for s in self.stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0
        )
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep]


@settings(max_examples=400, deadline=None)
@given(
    stops=st.lists(st.text("ab ", min_size=1, max_size=6), max_size=4).map(tuple),
    deltas=st.lists(st.text("ab c", max_size=5), max_size=12),
    keep=st.booleans(),
)
def test_the_matcher_matches_the_definition(
    stops: tuple[str, ...], deltas: list[str], keep: bool
) -> None:
    m, ref = StopMatcher(stops, keep=keep), Reference(stops, keep)
    for delta in deltas:
        assert m.feed(delta) == ref.feed(delta)
        assert (m.held, m.matched) == (ref.held, ref.matched)
    assert m.flush() == ("" if ref.matched else ref.held)


def test_long_stop_strings_cost_a_character_not_their_square() -> None:
    """64 stop strings of 1,024 characters, the most a request may have, one of
    them with a prefix the text keeps matching: 2,000 tokens took 16 s (8 ms
    each, for every sample of the request, holding up every other request's
    output); now milliseconds (the bound is 1 s: wide, on a shared machine).
    Their tables take 4 bytes a character (an Aho-Corasick automaton of them
    took 17 MB)."""
    stops = (*(f"Q{i:02d}" + "the " * 255 for i in range(63)), " the" * 255 + " END")
    tracemalloc.start()
    try:
        m = StopMatcher(stops)
        assert tracemalloc.get_traced_memory()[0] < 1 << 20
    finally:
        tracemalloc.stop()
    started = time.perf_counter()
    out = "".join(m.feed(" the") for _ in range(2000))
    assert time.perf_counter() - started < 1.0
    assert out == " the" * (2000 - 255) and len(m.held) == 1020
    assert m.feed(" END") == "" and m.matched == stops[-1]
    # the worst case: every stop string moves with each character (~15 us a character)
    alike = tuple(" the" * 255 + f"{i:03d}" + "!" for i in range(64))
    m, started = StopMatcher(alike), time.perf_counter()
    out = "".join(m.feed(" the") for _ in range(2000))
    assert time.perf_counter() - started < 3.0
    assert out == " the" * (2000 - 255) and m.matched is None

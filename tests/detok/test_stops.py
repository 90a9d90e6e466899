from __future__ import annotations

import pytest

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


def test_no_stop_strings_passes_everything() -> None:
    m = StopMatcher(())
    assert m.feed("anything") == "anything" and m.flush() == ""


def test_empty_stop_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        StopMatcher(("",))

"""``time_limit``: SIGALRM ends Python work in the main thread, and nothing of
it outlives the ``with`` (no late alarm, the previous handler back)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from rt.tok.timelimit import TimeLimitExceeded, time_limit


def spin(seconds: float) -> int:
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        n += 1
    return n


def test_work_past_the_limit_is_stopped_there() -> None:
    start = time.monotonic()
    with pytest.raises(TimeLimitExceeded), time_limit(0.2):
        spin(30.0)
    assert time.monotonic() - start < 10.0  # (stopped, not run out: 30 s)


def test_work_within_the_limit_is_untouched_and_no_alarm_comes_after() -> None:
    before = signal.getsignal(signal.SIGALRM)
    for _ in range(50):  # bodies that end close to the limit
        try:
            with time_limit(0.01):
                spin(0.0099)
        except TimeLimitExceeded:
            pass  # at the limit: that body's own timeout, inside the with
    spin(0.1)  # no alarm arrives later (it would end this test)
    assert signal.getsignal(signal.SIGALRM) == before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_no_limit_off_the_main_thread_or_at_zero() -> None:
    raised: list[BaseException] = []

    def work() -> None:
        try:
            with time_limit(0.05):
                spin(0.3)
        except BaseException as err:  # pragma: no cover - it is the failure
            raised.append(err)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert raised == []
    with time_limit(0):
        spin(0.1)

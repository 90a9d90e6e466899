"""A time limit on Python work in the main thread: SIGALRM raises out of it.

A chat template is code, and the client sets some of its variables
(``chat_template_kwargs``): a template that loops on one of them
(``{"reps": 100000}``) rendered for minutes, held the tokenizer until the
watchdog killed it, three times, and the request then failed as poison (a 500
after ~90 s, the one-worker server serving nobody meanwhile). Jinja renders
in Python, so a signal handler, which runs between bytecodes in the main
thread, ends it: the request is refused alone, at the limit.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class TimeLimitExceeded(BaseException):
    """The work under :func:`time_limit` ran past it. A BaseException, so that no
    ``except Exception`` in the code it interrupts (Jinja's, transformers') can
    swallow it and go on."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`TimeLimitExceeded` in the body once it has run ``seconds``.

    Only in the main thread (where Python runs signal handlers, and where the
    tokenizer renders templates); elsewhere, or with ``seconds`` ≤ 0, no limit.
    Not reentrant. The handler raises once, and never after the body is done:
    an alarm that comes as the body ends either is that body's timeout (still
    inside this ``with``) or does nothing."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return
    armed = True

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        nonlocal armed
        if armed:
            armed = False
            raise TimeLimitExceeded(seconds)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        try:
            yield
        finally:
            armed = False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        # (a tripped alarm whose handler has not run yet is skipped once the
        # default is back: CPython ignores tripped signals whose handler is reset)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)

"""The ``rt-serve`` console script. Its first act is to take SIGTERM, SIGINT and
SIGHUP, before Python imports the server (half a second) and :func:`rt.serve.main`
checks the flags (seconds: torch, the tokenizer): a Ctrl-C then was a
KeyboardInterrupt traceback. A signal taken here stops the server before its
start-up, as one that comes during the start-up does. (Only the interpreter's own
start-up, tens of milliseconds, is left to Python's default handlers.)"""

from __future__ import annotations

import signal
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # rt.frontend.drain.SIGNALS


def main() -> int:
    early: list[str] = []

    def remember(signum: int, frame: Any) -> None:
        early.append(signal.Signals(signum).name)

    for signum in SIGNALS:
        signal.signal(signum, remember)
    from rt.serve import main as serve

    return serve(early=early)

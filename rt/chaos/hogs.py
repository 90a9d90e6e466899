"""CPU hogs: busy processes that compete with rt's actors for the cores.

Each is bounded twice: it ends by itself after ``max_s`` seconds, and
:func:`hogs` kills and reaps it when the ``with`` ends.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

BUSY = "import time\nend = time.monotonic() + {max_s}\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def hogs(count: int, max_s: float = 3600.0) -> Iterator[list[int]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUSY.format(max_s=max_s)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()

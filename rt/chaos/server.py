"""rt-serve as a subprocess of the harness, on 127.0.0.1 and a free port.

Its stderr is read line by line, timestamped (the fault lines its actors
write become ``fault`` events) and copied to a log file. It is stopped with
SIGTERM (it drains, then exits 0) and SIGKILLed if it outlives
``stop_timeout``.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import IO

import trio

from rt.chaos.monitor import Lines

READY = re.compile(r"rt-serve ready on (http://[^\s]+)")


class ServerProcess:
    def __init__(self, proc: trio.Process, log: IO[bytes]) -> None:
        self.proc, self.log = proc, log
        self.lines: Lines = deque()
        self.tail: deque[str] = deque(maxlen=40)
        self.url: str | None = None
        self.ready = trio.Event()
        self.eof = trio.Event()  # its stderr closed: it and every actor it started are gone
        self.code: int | None = None
        self.terminated = False  # SIGTERM sent: a second one would not drain again

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    async def read(self) -> None:
        assert self.proc.stderr is not None
        buffer = b""
        async for chunk in self.proc.stderr:
            at = time.monotonic()
            self.log.write(chunk)
            self.log.flush()
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for raw in complete:
                line = raw.decode(errors="replace")
                self.lines.append((at, line))
                self.tail.append(line)
                match = READY.search(line)
                if match and self.url is None:
                    self.url = match.group(1)
                    self.ready.set()
        self.ready.set()  # it ended: whoever waits sees no url
        self.eof.set()

    def terminate(self) -> None:
        if not self.terminated and self.proc.returncode is None:
            self.terminated = True
            self.proc.send_signal(signal.SIGTERM)

    async def stop(self, timeout: float) -> int:
        """SIGTERM (once), wait up to ``timeout``, then SIGKILL."""
        self.terminate()
        with trio.move_on_after(timeout):
            self.code = await self.proc.wait()
        if self.code is None:
            self.proc.kill()
            self.code = await self.proc.wait()
        return self.code


@asynccontextmanager
async def open_server(
    args: list[str],
    log: IO[bytes],
    start_timeout: float = 300.0,
    stop_timeout: float = 120.0,
) -> AsyncIterator[ServerProcess]:
    """Start ``rt-serve --port 0 ARGS``; stop it (SIGTERM) on exit unless it stopped."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "rt.serve", "--host", "127.0.0.1", "--port", "0", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    server = ServerProcess(proc, log)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.read)
        try:
            with trio.move_on_after(start_timeout):
                await server.ready.wait()
            if server.url is None:
                raise RuntimeError(
                    "rt-serve did not become ready:\n" + "\n".join(list(server.tail)[-20:])
                )
            yield server
        finally:
            with trio.CancelScope(shield=True):
                await server.stop(stop_timeout)
                with trio.move_on_after(10):  # an actor that outlived it holds the pipe
                    await server.eof.wait()
                nursery.cancel_scope.cancel()
    if proc.stderr is not None:
        with trio.CancelScope(shield=True):
            await proc.stderr.aclose()

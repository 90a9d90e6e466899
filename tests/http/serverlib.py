"""``rt-serve`` as a subprocess on 127.0.0.1 (a free port) for the tests.

A shared server is a child of the test process for the whole module or
session, which the suite-wide leak check would report after every test:
modules that use one mark their tests ``leaks_ok``, and :func:`running_server`
checks instead, when the server stops, that it exited 0 and left no actor
process and no shared-memory segment behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import small_shm
from prometheus_client.parser import text_string_to_metric_families

READY = re.compile(r"rt-serve ready on http://127\.0\.0\.1:(\d+)")
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
SLOW_STEPS = {  # every scheduler step takes 20 ms more: requests stay in flight long enough to watch
    "seed": 1,
    "faults": [
        {"actor": "scheduler", "point": "step", "action": "delay", "delay_ms": 20, "times": 0}
    ],
}


class Server:
    """A running ``rt-serve``: its process, address and log (stderr lines)."""

    def __init__(self, proc: subprocess.Popen[str], headers: dict[str, str]) -> None:
        self.proc = proc
        self.headers = headers  # what every request needs (the API key)
        self.log: list[str] = []
        self.port = 0
        self.pids: dict[str, int] = {}  # actor name -> pid
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))
            match = READY.search(line)
            if match:
                self.port = int(match.group(1))
                self._ready.set()
        self._ready.set()  # EOF: the process ended

    def wait_ready(self) -> None:
        if not self._ready.wait(START_TIMEOUT_S) or not self.port:
            self.proc.kill()
            raise AssertionError("rt-serve did not become ready:\n" + "\n".join(self.log[-40:]))

    def info(self) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/server_info", headers=self.headers, timeout=30)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    def actor_pids(self) -> dict[str, int]:
        return {a["name"]: a["pid"] for a in self.info()["actors"]}

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal it, wait for it, and check that nothing is left behind."""
        try:
            self.pids = self.actor_pids()  # the current incarnations
        except httpx.HTTPError:
            pass  # already stopping: the last known ones
        pids = list(self.pids.values())
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(STOP_TIMEOUT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(5)
            if self.proc.stderr is not None:
                self.proc.stderr.close()
        deadline = time.monotonic() + 5
        while [p for p in pids if alive(p)] and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in pids if alive(p)]
        segments = [s for s in os.listdir("/dev/shm") if s.startswith(f"rt_{self.proc.pid}_")]
        assert not left, f"actor processes left running: {left}"
        assert not segments, f"shared-memory segments left: {segments}"
        return code


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def children_of(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(entry))
            except (OSError, ValueError):
                continue
    return kids


def start_server(*args: str, shm_size: str | None = None, fd_limit: int = 0) -> Server:
    """``rt-serve args``; with ``shm_size``, under a /dev/shm of its own of that
    size (tests/small_shm.py); with ``fd_limit``, allowed that many open files."""
    if not any(a.startswith(("--torch-threads", "--scheduler-cpus")) for a in args):
        # One torch thread: beside the other xdist worker, two threads' synchronisation
        # on two busy cores made 480-token requests take minutes instead of seconds.
        args = ("--torch-threads=1", *args)
    command = [sys.executable, "-m", "rt.serve", "--port", "0", *args]
    if fd_limit:
        command = ["prlimit", f"--nofile={fd_limit}:{fd_limit}", *command]
    proc = subprocess.Popen(
        small_shm.argv(shm_size, command) if shm_size else command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    keys = [a.split("=", 1)[1] for a in args if a.startswith("--api-key=")]
    server = Server(proc, {"Authorization": f"Bearer {keys[0]}"} if keys else {})
    server.wait_ready()
    server.pids = server.actor_pids()
    return server


@contextmanager
def running_server(*args: str, shm_size: str | None = None, fd_limit: int = 0) -> Iterator[Server]:
    server = start_server(*args, shm_size=shm_size, fd_limit=fd_limit)
    try:
        yield server
    except BaseException:
        server.stop()
        raise
    code = server.stop()
    tail = "\n".join(server.log[-40:])
    assert code == 0, f"rt-serve exited with {code}:\n{tail}"


def metrics(server: Server) -> dict[str, float]:
    """Every sample of its /metrics, keyed ``name{label=value,...}``."""
    text = httpx.get(f"{server.url}/metrics", headers=server.headers, timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def write_plan(path: Path, plan: dict[str, Any]) -> str:
    path.write_text(json.dumps(plan))
    return str(path)


def model_id(client: openai.OpenAI) -> str:
    """The id of the one model an OpenAI-compatible server serves."""
    return client.models.list().data[0].id

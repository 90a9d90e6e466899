"""Starting the servers tools/bench_serving.py compares: rt-serve and
`transformers serve --continuous-batching`, each on a free port of 127.0.0.1,
healthy before the load starts and stopped after."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def client_pinned(cpus: str | None) -> Iterator[None]:
    """This process (the load generator) pinned to ``cpus`` for a while (None: not
    pinned): a server started with ``--scheduler-cpus`` keeps its scheduler's CPUs
    to itself only if the client on the same host stays off them too. The servers
    are started outside, so they keep every CPU."""
    if cpus is None:
        yield
        return
    from rt.actors.affinity import parse_cpu_list, pin_process

    before = os.sched_getaffinity(0)
    pin_process(parse_cpu_list(cpus))
    try:
        yield
    finally:
        pin_process(before)


def parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a value is an int, a float, true/false, or a string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise SystemExit(f"--rt-option takes KEY=VALUE, got {pair!r}")
        value: Any = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            for kind in (int, float):
                try:
                    value = kind(raw)
                    break
                except ValueError:
                    pass
        out[key] = value
    return out


def option_flags(
    options: dict[str, Any],
    names: dict[str, str],
    switches: dict[tuple[str, bool], str] | None = None,
) -> list[str]:
    """Engine options as rt-serve flags: ``load_format="null"`` → ``--load-format null``.
    ``names`` maps the options whose flag is not the option's own name
    (``seed`` → ``--random-seed``); ``switches`` maps a boolean option and its
    value to the switch that sets it (``("cuda_graph", False)`` →
    ``--disable-cuda-graph``). A value with no switch of its own is left out
    where a switch sets the other value (then it is the default: nothing
    turns ``cuda_graph`` on), and otherwise is the option's own flag when
    True, left out when False (off by default)."""
    switches = switches or {}
    flags = []
    for key, value in options.items():
        if isinstance(value, bool):
            switch = switches.get((key, value))
            if switch is not None:
                flags.append(switch)
            elif value and (key, False) not in switches:
                flags.append(names.get(key, "--" + key.replace("_", "-")))
            continue
        flags += [names.get(key, "--" + key.replace("_", "-")), str(value)]
    return flags


def rt_serve_flags() -> tuple[dict[str, str], dict[tuple[str, bool], str]]:
    """rt-serve's flag for each engine option that takes a value, and its switch
    for each boolean option and value (``("torch_compile", True)`` →
    ``--enable-torch-compile``)."""
    from rt import serve

    names = {flag.option: flag.name for flag in serve.ENGINE_FLAGS}
    switches = {(option, value): name for name, (option, value, _) in serve.SWITCHES.items()}
    return names, switches


LAUNCHABLE = ("rt", "transformers")  # the servers server_command starts


def server_command(kind: str, port: int, model_path: str, rt_options: dict[str, Any]) -> list[str]:
    host = ["--host", "127.0.0.1", "--port", str(port)]
    if kind == "rt":
        flags = [*host, "--model-path", model_path]
        flags += option_flags(rt_options, *rt_serve_flags())
        return [sys.executable, "-m", "rt.serve", *flags]
    if kind == "transformers":
        cli = str(Path(sys.executable).with_name("transformers"))
        return [cli, "serve", "--continuous-batching", *host, "--log-level", "error", model_path]
    raise ValueError(f"--launch takes rt or transformers, got {kind!r}")


@contextmanager
def launched(
    command: list[str], port: int, timeout: float, headers: dict[str, str]
) -> Iterator[str]:
    """Run a server until it answers ``GET /health`` with 200; yield its URL;
    stop it (SIGTERM, then SIGKILL after 30 s)."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    said = log.read().decode(errors="replace")[-3000:]
                    raise SystemExit(
                        f"{shlex.join(command)} exited with {proc.returncode}:\n{said}"
                    )
                try:
                    if httpx.get(f"{url}/health", headers=headers, timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"{shlex.join(command)}: not healthy within {timeout:g} s")
                time.sleep(0.25)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def served_model(url: str, headers: dict[str, str]) -> str | None:
    import httpx

    try:
        models = httpx.get(f"{url}/v1/models", headers=headers, timeout=10).json()
        return str(models["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None

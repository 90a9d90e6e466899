"""Suite-wide: after every test, assert that it left nothing behind.

* no child process of the test process, running or zombie (every child reaped);
* no orphan: no other process carrying this session's ``RT_TEST_SESSION``
  environment tag (inherited by every descendant) still running;
* no new ``/dev/shm/rt_<this pid>_*`` segment;
* no new eventfd, pidfd, socket or pipe fd in the test process (except in the
  test that first uses CUDA: the driver opens descriptors of its own then, and
  keeps them for the life of the process).

Whatever leaked is cleaned up after the failure is reported, so one leak
does not fail the tests that follow. A test that must leave something (say
why) is marked ``@pytest.mark.leaks_ok``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# Without CUDA, rt's Triton kernels run under Triton's interpreter, which must be chosen
# before triton.language is imported (transformers' model code imports it): here, first.
# A device node, not torch: this file stays light for the tests that never import torch.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

SESSION_TAG = "RT_TEST_SESSION"
# Under pytest-xdist each worker is a session of its own: its tag is its pid, not
# the controller's it inherited (else it would take a sibling's actors for orphans).
if os.environ.get("PYTEST_XDIST_WORKER") or SESSION_TAG not in os.environ:
    os.environ[SESSION_TAG] = str(os.getpid())
_TAG = f"{SESSION_TAG}={os.environ[SESSION_TAG]}".encode()
_WATCHED_FD_KINDS = ("anon_inode:[eventfd]", "anon_inode:[pidfd]", "socket:", "pipe:", "/dev/shm/")
SETTLE_S = 10.0  # how long a dying process may take to disappear (generous: a loaded machine)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "leaks_ok: the test may leave processes, segments or fds (say why)"
    )


def _processes() -> tuple[list[tuple[int, str]], list[int]]:
    """(our children as (pid, state), running processes carrying our tag but not ours)."""
    me = os.getpid()
    children, orphans = [], []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            state, ppid = stat[stat.rindex(b")") + 2 :].split()[:2]
            if int(ppid) == me:
                children.append((pid, state.decode()))
                continue
            if state == b"Z":
                continue  # dead, waiting for init to reap it
            with open(f"/proc/{pid}/environ", "rb") as f:
                if _TAG in f.read().split(b"\0"):
                    orphans.append(pid)
        except (OSError, ValueError):
            continue
    return children, orphans


def _fds() -> dict[int, str]:
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(_WATCHED_FD_KINDS):
            fds[int(name)] = target
    return fds


def _segments() -> set[str]:
    prefix = f"rt_{os.getpid()}_"
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_initialized())


def _cleanup(children: list[tuple[int, str]], orphans: list[int], segments: set[str]) -> None:
    for pid in [pid for pid, _ in children] + orphans:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid, _ in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    for name in segments:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/{name}")


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    fds_before, segments_before = _fds(), _segments()
    cuda_before = _cuda_initialized()
    yield
    if request.node.get_closest_marker("leaks_ok"):
        return
    deadline = time.monotonic() + SETTLE_S
    while True:
        children, orphans = _processes()
        live_children = [c for c in children if c[1] != "Z"]
        if not (live_children or orphans) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    segments = _segments() - segments_before
    new_fds = {fd: t for fd, t in _fds().items() if fds_before.get(fd) != t}
    if not cuda_before and _cuda_initialized():
        new_fds = {}  # the CUDA driver's own, opened at its first use in this process
    problems = []
    if children:
        problems.append(f"child processes not reaped (pid, state): {children}")
    if orphans:
        problems.append(f"orphan processes still running {SETTLE_S} s after the test: {orphans}")
    if segments:
        problems.append(f"shared-memory segments left in /dev/shm: {sorted(segments)}")
    if new_fds:
        problems.append(f"fds left open: {new_fds}")
    if problems:
        _cleanup(children, orphans, segments)
        pytest.fail("the test leaked:\n  " + "\n  ".join(problems), pytrace=False)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama checkpoint with its own trained tokenizer, saved the way
    Hugging Face saves models, so rt loads it through its real loading code."""
    import torch  # here, not at the top: only the tests that use it pay for the import
    import transformers
    from tiny_tokenizer import make_tokenizer

    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(path)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.5,  # well-separated logits: greedy ties are not an issue
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path

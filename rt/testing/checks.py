"""Assertions for tests: nothing leaked, every request ended once; and a
request that writes itself into a ledger."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from rt.chaos import checks, leaks
from rt.chaos.ledger import Ledger
from rt.chaos.transports import End, engine_sender, run_request, sse_sender
from rt.chaos.workload import RequestSpec

_indexes = itertools.count()


@contextmanager
def no_leaks(root_pids: Iterable[int] = (), settle_s: float = 10.0) -> Iterator[leaks.Snapshot]:
    """Fail (AssertionError) if the body leaves a process (child, zombie or
    orphan), a shared-memory segment of this process, of ``root_pids`` (an
    rt-serve subprocess's pid) or of an rt-serve the body's ``open_server``
    started (they went unchecked), or an fd behind."""
    from rt.testing.engines import SERVED

    tag = leaks.tag_environment()
    before, served = leaks.snapshot(tag=tag), len(SERVED)
    yield before
    roots = [*root_pids, *SERVED[served:]]
    assert_no_leaks(before, [os.getpid(), *roots] if roots else (), tag=tag, settle_s=settle_s)


def assert_no_leaks(
    before: leaks.Snapshot,
    root_pids: Iterable[int] = (),
    tag: str | None = None,
    settle_s: float = 10.0,
) -> None:
    found = leaks.leaks(before, root_pids, tag=tag or leaks.tag_environment(), settle_s=settle_s)
    assert not found, "left behind:\n  " + "\n  ".join(found)


def assert_terminal(ledger: Ledger) -> None:
    """Every request in ``ledger`` reached exactly one terminal state (completed,
    cancelled, failed-retryable or failed-final): none lost, hung or ended twice."""
    found = checks.terminal(ledger)
    assert not found, "\n".join(str(f) for f in found)


async def send(
    target: Any,
    ledger: Ledger,
    prompt: str,
    *,
    cancel_after: int | None = None,
    timeout: float = 120.0,
    **options: Any,
) -> End:
    """Run one request on an engine (streamed) or a Server (SSE), writing its
    invocation, deltas and terminal state to ``ledger``; returns how it ended."""
    spec = RequestSpec(
        index=next(_indexes),
        transport="engine" if hasattr(target, "supervisor") else "sse",
        prompt=prompt,
        max_new_tokens=int(options.pop("max_new_tokens", 16)),
        temperature=float(options.pop("temperature", 0.0)),
        top_p=float(options.pop("top_p", 1.0)),
        seed=options.pop("seed", None),
        cancel_after=cancel_after,
        extra=options,
    )
    if spec.transport == "engine":
        sender = engine_sender(target)
    else:
        sender = sse_sender(target.http, target.url, "testing")
    return await run_request(spec, sender, ledger, _Untracked(), timeout)


class _Untracked:
    def started(self, index: int) -> None: ...
    def got(self, index: int, tokens: int) -> None: ...
    def ended(self, index: int) -> None: ...

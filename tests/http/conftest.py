"""Fixtures: the rt-serve on the default model that tests/http share, and a tiny
checkpoint.

Every test here is marked ``leaks_ok``: a shared rt-serve is a child of the
test process across many tests, which the suite-wide leak check would report
(and kill). Each server is checked instead when it stops: exit status 0, no
actor process and no shared-memory segment left (``serverlib.Server.stop``),
and the shared one is stopped after the directory's last test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from serverlib import Server, start_server

HERE = Path(__file__).resolve().parent
SHARED = pytest.StashKey[Server]()


@pytest.fixture(scope="module")
def client(default_server: Server) -> Iterator[openai.OpenAI]:
    """The official openai client, on the shared server (a module may have its own)."""
    with openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="none", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def default_server(request: pytest.FixtureRequest) -> Server:
    """The shipped default model with default options, one for all of tests/http:
    started by the first test that asks, stopped (and checked) by the hook below
    after the directory's last test, so that it never outlives tests/http (a
    session fixture would, and every later test would see it as a leak)."""
    stash = request.config.stash
    if SHARED not in stash:
        stash[SHARED] = start_server()
    return stash[SHARED]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.leaks_ok)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    stash = item.config.stash
    leaving = nextitem is None or not nextitem.path.resolve().is_relative_to(HERE)
    if leaving and SHARED in stash:
        server = stash[SHARED]
        del stash[SHARED]
        code = server.stop()
        tail = "\n".join(server.log[-40:])
        assert code == 0, f"rt-serve exited with {code}:\n{tail}"

"""A tokenizer actor that fails on cue, for the fault tests. Importable by the
children: the parent's sys.path travels to them, and pytest puts this folder on it.

Cues in a request's text:

* ``POISON``: the process dies (``os._exit``) inside ``TokenizerCore.encode``,
  on any batch that holds the text, as a segfault in the Rust tokenizer would:
  there is no exception to catch.
* ``RAISE``: the tokenizer's (batched) call raises, as the real one does on a
  text it cannot take; encoding the other texts alone works.
* ``HOLD <folder>``: the batch holding it creates ``<folder>/entered`` and waits
  for ``<folder>/go``, so that a test can queue the next batch frame by frame.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rt.actors import ActorContext
from rt.messages import GenerateRequest
from rt.pipeline.tokenizer import TokenizerActor
from rt.tok.core import Result, TokenizerCore

POISON, RAISE, HOLD = "POISON", "RAISE", "HOLD "
HOLD_TIMEOUT_S = 30.0


class Picky:
    """A tokenizer whose call raises on any batch holding a text with ``RAISE``."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def __call__(self, texts: list[str], **kwargs: Any) -> Any:
        if any(RAISE in t for t in texts):
            raise TypeError("this tokenizer cannot take that text")
        return self._tokenizer(texts, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


class CuedCore(TokenizerCore):
    def encode(
        self, reqs: Sequence[GenerateRequest], texts: Sequence[str | Exception | None]
    ) -> list[Result]:
        given = [r.text for r in reqs if isinstance(r.text, str)]
        if any(POISON in t for t in given):
            os._exit(1)
        for t in given:
            if t.startswith(HOLD):
                hold(Path(t.removeprefix(HOLD)))
        return super().encode(reqs, texts)


def hold(folder: Path) -> None:
    (folder / "entered").touch()
    deadline = time.monotonic() + HOLD_TIMEOUT_S
    while not (folder / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.005)


class CuedTokenizer(TokenizerActor):
    async def startup(self, ctx: ActorContext) -> None:
        await super().startup(ctx)
        core = self.core
        self.core = CuedCore(Picky(core.tokenizer), core.context_length, core.vocab_size)

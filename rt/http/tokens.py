"""Token ids as text, for the OpenAI logprobs formats and ``echo`` of a token-id
prompt. The tokenizer is loaded in the main process on first use (in a worker
thread), from ``tokenizer.json`` with the ``tokenizers`` library where the model
has one (20 ms, no transformers import); else through ``rt.tok.load``."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import trio


class TokenTexts:
    def __init__(self, tokenizer_path: str) -> None:
        self._path = tokenizer_path
        self._decode: Any = None
        self._lock = trio.Lock()

    async def ensure(self) -> None:
        async with self._lock:
            if self._decode is None:
                self._decode = await trio.to_thread.run_sync(_load, self._path)

    def decode(self, ids: Sequence[int]) -> str:
        assert self._decode is not None, "await ensure() first"
        return str(self._decode(list(ids)))

    def text(self, token_id: int) -> str:
        return _one(self._decode, token_id)


@lru_cache(maxsize=1 << 16)
def _one(decode: Any, token_id: int) -> str:
    return str(decode([token_id]))


def _load(path: str) -> Any:
    if (Path(path) / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
        return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
    from rt.tok.load import load_tokenizer

    hf = load_tokenizer(path)
    return lambda ids: hf.decode(ids, skip_special_tokens=False)

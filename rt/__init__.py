"""rt: an LLM serving runtime that stays up.

Tokenizer, scheduler and detokenizer run as supervised processes that talk
through lock-free shared-memory rings; see docs/architecture.md.

    async with rt.open_engine() as engine:        # the shipped default model
        out = await engine.generate("Once upon a time", max_new_tokens=32, temperature=0.0)
        async for chunk in engine.stream("In the beginning", max_new_tokens=16, seed=7):
            print(chunk.text, end="")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rt import errors

__version__ = "0.1.0"

__all__ = [
    "Chunk",
    "Engine",
    "EngineOptions",
    "GenerateOutput",
    "__version__",
    "errors",
    "open_engine",
]

if TYPE_CHECKING:
    from rt.config import EngineOptions
    from rt.frontend.engine import Engine
    from rt.frontend.start import open_engine
    from rt.outputs import Chunk, GenerateOutput

_LAZY = {
    "open_engine": "rt.frontend.start",
    "Engine": "rt.frontend.engine",
    "EngineOptions": "rt.config",
    "Chunk": "rt.outputs",
    "GenerateOutput": "rt.outputs",
}


def __getattr__(name: str) -> Any:
    # Imported on first use: `import rt.shm` in an actor process must not pull in
    # the engine (and torch) through this package's __init__.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rt' has no attribute {name!r}")

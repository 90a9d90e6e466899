"""rt: an LLM serving runtime that stays up.

Tokenizer, scheduler and detokenizer run as supervised processes that talk
through lock-free shared-memory rings; see docs/architecture.md.
"""

from __future__ import annotations

from rt import errors

__version__ = "0.1.0"

__all__ = ["__version__", "errors"]

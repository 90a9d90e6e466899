"""Load a model directory's tokenizer without importing torch where possible.

``AutoTokenizer`` imports torch (seconds of start-up, paid again by every
restarted tokenizer or detokenizer); ``PreTrainedTokenizerFast`` does not,
and serves every checkpoint that ships a ``tokenizer.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rt.errors import ModelLoadError


def load_tokenizer(path: str) -> Any:
    if (Path(path) / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path)
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ModelLoadError(
            f"no usable tokenizer in {path}: expected tokenizer.json (or files AutoTokenizer reads)"
        ) from err

"""Files that ship inside the rt package."""

from __future__ import annotations

from pathlib import Path

__all__ = ["default_model_path"]


def default_model_path() -> Path:
    """Directory of the tiny default model, in Hugging Face format.

    A ~4M-parameter Llama-architecture causal LM with its own byte-level BPE
    tokenizer and chat template, trained on the King James Bible by
    ``tools/train_tiny_model.py`` (see ``README.md`` in the directory). It is
    small enough to serve on a CPU and in tests; its text is fluent-looking
    KJV English, not a useful assistant. Pass the path to
    ``transformers.AutoModelForCausalLM.from_pretrained`` and
    ``AutoTokenizer.from_pretrained``; nothing is downloaded.
    """
    return Path(__file__).resolve().parent / "default_model"

"""What a Hugging Face model directory holds besides weights: tokenizer, stop ids, chat template."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rt.errors import ModelLoadError
from rt.gpu.model_config import ModelConfig


@dataclass(frozen=True)
class ModelFiles:
    """The parsed, weight-free part of a model directory."""

    path: Path
    config: ModelConfig
    eos_token_ids: tuple[int, ...]  # generation_config.json first, then config.json
    chat_template: str | None
    tokenizer_file: Path | None


def read_model_dir(model_path: str | Path) -> ModelFiles:
    """Parse config.json, generation_config.json and the tokenizer's files of ``model_path``."""
    path = Path(model_path)
    if not path.is_dir():
        raise ModelLoadError(f"model path {str(path)!r} is not a directory")
    config = ModelConfig.from_dir(path)
    gen = _read_json(path / "generation_config.json") or {}
    eos: list[int] = []
    for source in (gen.get("eos_token_id"), config.eos_token_ids):
        for tok in [source] if isinstance(source, int) else (source or ()):
            if int(tok) not in eos:
                eos.append(int(tok))
    tok_cfg = _read_json(path / "tokenizer_config.json") or {}
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text()
    tokenizer_file = path / "tokenizer.json"
    return ModelFiles(
        path=path,
        config=config,
        eos_token_ids=tuple(eos),
        chat_template=template,
        tokenizer_file=tokenizer_file if tokenizer_file.is_file() else None,
    )


def load_tokenizer(files: ModelFiles) -> Any:
    """A ``tokenizers.Tokenizer`` for the directory's tokenizer.json."""
    if files.tokenizer_file is None:
        raise ModelLoadError(
            f"{files.path}/tokenizer.json not found: rt needs a fast tokenizer file (tokenizer.json)"
        )
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(files.tokenizer_file))


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"{path} is not valid JSON: {err}") from err
    return data if isinstance(data, dict) else None

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
    # generation_config.json's first, then config.json's, then the tokenizer's own (as
    # vLLM and SGLang stop at it too)
    eos_token_ids: tuple[int, ...]
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
    tok_cfg = _read_json(path / "tokenizer_config.json") or {}
    tokenizer_file = path / "tokenizer.json"
    for source in (gen.get("eos_token_id"), config.eos_token_ids, _tokenizer_eos(path, tok_cfg)):
        for tok in source if isinstance(source, list | tuple) else [source]:
            if tok is None:  # ([2, null]: none named there)
                continue
            try:
                tok = int(tok)  # (a string of digits, as some configs write it)
            except (TypeError, ValueError) as err:
                raise ModelLoadError(
                    f"{path}: eos_token_id: expected token ids, got {source!r}"
                ) from err
            if tok not in eos:
                eos.append(tok)
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text()
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


def _tokenizer_eos(path: Path, tok_cfg: dict[str, Any]) -> int | None:
    """The id of tokenizer_config.json's ``eos_token``: from its ``added_tokens_decoder``
    (where transformers writes every special token with its id), else from
    tokenizer.json's added tokens or vocabulary (maybe 16 MB, read only then; one
    that does not read names none: another may serve, ``tokenizer_path``). None
    when none names it."""
    name = tok_cfg.get("eos_token")
    if isinstance(name, dict):  # {"content": "</s>", ...}
        name = name.get("content")
    if not isinstance(name, str):
        return None
    added = tok_cfg.get("added_tokens_decoder")
    if isinstance(added, dict):
        listed_here = [int(k) for k, t in added.items() if k.isdigit() and _names(t, name)]
        if listed_here:
            return listed_here[0]
    try:
        data = json.loads((path / "tokenizer.json").read_text())
        listed, vocab = data.get("added_tokens") or [], (data.get("model") or {}).get("vocab")
    except (OSError, ValueError, AttributeError):
        return None
    ids: list[Any] = [t.get("id") for t in listed if _names(t, name)]
    if isinstance(vocab, dict):  # (BPE's, WordPiece's, WordLevel's: token → id)
        ids.append(vocab.get(name))
    elif isinstance(vocab, list):  # (Unigram's: [token, score] at its id)
        ids += [
            i for i, entry in enumerate(vocab) if isinstance(entry, list) and entry[:1] == [name]
        ]
    return next((i for i in ids if isinstance(i, int)), None)


def _names(token: Any, name: str) -> bool:
    return isinstance(token, dict) and token.get("content") == name


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"{path} is not valid JSON: {err}") from err
    return data if isinstance(data, dict) else None

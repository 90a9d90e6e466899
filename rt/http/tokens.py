"""Token ids as text and as bytes, for the OpenAI logprobs formats and ``echo``
of a token-id prompt. The tokenizer is loaded in the main process on first use
(in a worker thread), from ``tokenizer.json`` with the ``tokenizers`` library
where the model has one (20 ms, no transformers import); else through
``rt.tok.load``. ``/tokenize`` encodes with :class:`Encoder`: the tokenizer the
workers load (``rt.tok.load``), for the same ids."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import trio

from rt.errors import InvalidRequestError
from rt.frontend.chat import check_unicode
from rt.http.asgi import HTTPError
from rt.tok.core import encode_each, unencodable
from rt.tok.load import load_tokenizer

BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte tokens
METASPACE = "\u2581"  # SentencePiece's word boundary, a space in the text


@dataclass(frozen=True, eq=False)
class _Vocab:
    decode: Callable[[list[int]], str]
    piece: Callable[[int], str | None]  # the token as the vocabulary writes it
    specials: frozenset[int]
    byte_level: bool  # pieces are bytes written as GPT-2's printable characters


class TokenTexts:
    def __init__(self, tokenizer_path: str) -> None:
        self._path = tokenizer_path
        self._vocab: _Vocab | None = None
        self._lock = trio.Lock()
        self._texts: dict[int, str] = {}

    async def ensure(self) -> None:
        async with self._lock:
            if self._vocab is None:
                self._vocab = await trio.to_thread.run_sync(_load, self._path)

    @property
    def vocab(self) -> _Vocab:
        assert self._vocab is not None, "await ensure() first"
        return self._vocab

    def decode(self, ids: Sequence[int]) -> str:
        return self.vocab.decode(list(ids))

    def text(self, token_id: int) -> str:
        """The token decoded alone (a piece of a UTF-8 character decodes to U+FFFD)."""
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.vocab.decode([token_id])
        return text

    def special(self, token_id: int) -> bool:
        return token_id in self.vocab.specials

    def bytes(self, token_id: int) -> list[int]:
        """The token's own bytes, as OpenAI's ``bytes`` field means them: for a
        token that is part of a UTF-8 character, that part (not U+FFFD's)."""
        vocab = self.vocab
        piece = vocab.piece(token_id)
        if piece is not None and token_id not in vocab.specials:
            if vocab.byte_level and all(c in _byte_of() for c in piece):
                return [_byte_of()[c] for c in piece]
            if m := BYTE_FALLBACK.fullmatch(piece):
                return [int(m.group(1), 16)]
            if METASPACE in piece and not vocab.byte_level:  # SentencePiece's "▁the": " the"
                return list(piece.replace(METASPACE, " ").encode())  # (alone, it decodes "the")
        return list(self.text(token_id).encode())


@cache
def _byte_of() -> dict[str, int]:
    """GPT-2's byte-level alphabet: each byte as the printable character that
    stands for it in a byte-level BPE vocabulary, inverted."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    for extra, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + extra)
    return {c: b for b, c in chars.items()}


def _load(path: str) -> _Vocab:
    if (Path(path) / "tokenizer.json").is_file():
        from tokenizers import Tokenizer, decoders

        tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
        added = tokenizer.get_added_tokens_decoder()
        return _Vocab(
            decode=lambda ids: str(tokenizer.decode(ids, skip_special_tokens=False)),
            piece=tokenizer.id_to_token,
            specials=frozenset(i for i, tok in added.items() if tok.special),
            byte_level=isinstance(tokenizer.decoder, decoders.ByteLevel),
        )
    hf = load_tokenizer(path)
    return _Vocab(
        decode=lambda ids: str(hf.decode(ids, skip_special_tokens=False)),
        piece=lambda i: hf.convert_ids_to_tokens(i),
        specials=frozenset(hf.all_special_ids),
        byte_level=False,
    )


class Encoder:
    """The engine's tokenizer in this process, loaded on first use."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._tokenizer: Any = None
        self._lock = trio.Lock()

    async def encode(self, texts: list[str], add_special: bool, name: str) -> list[list[int]]:
        """Each text's ids; one the tokenizer cannot encode is a 400 naming it
        (``name``, the field the texts came in)."""
        async with self._lock:  # (held while it encodes: one text's memory at a time)
            if self._tokenizer is None:
                tokenizer = await trio.to_thread.run_sync(load_tokenizer, self._path)
                tokenizer.model_max_length = 1 << 62  # (a text past the context is no warning)
                self._tokenizer = tokenizer
            return await trio.to_thread.run_sync(self._encode, texts, add_special, name)

    def _encode(self, texts: list[str], add_special: bool, name: str) -> list[list[int]]:
        for k, text in enumerate(texts):  # (a lone surrogate named, as a prompt's is)
            field = name if len(texts) == 1 else f"{name}[{k}]"
            try:
                check_unicode(field, text)
            except InvalidRequestError as err:
                raise HTTPError(400, str(err), param=field) from None
        out = []
        for k, ids in enumerate(encode_each(self._tokenizer, texts, add_special)):
            if isinstance(ids, Exception):
                field = name if len(texts) == 1 else f"{name}[{k}]"
                raise HTTPError(400, f"{field}: {unencodable(ids)}", param=field) from ids
            out.append(ids)
        return out

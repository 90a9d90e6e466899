"""``text_offsets`` over the default model's own vocabulary (rt.http.tokens, as
the server loads it), for texts the detokenizer makes that a server cannot be
made to produce at will."""

from __future__ import annotations

from types import SimpleNamespace

from tokenizers import Tokenizer

from rt.assets import default_model_path
from rt.http.openai_format import TextCursor, text_offsets
from rt.http.tokens import TokenTexts


async def test_a_lone_byte_that_ends_as_u_fffd_is_before_the_next_tokens_text() -> None:
    """A byte that begins a character the next token does not go on with shows as
    U+FFFD: the next token starts after it (it pointed at the U+FFFD)."""
    texts = TokenTexts(str(default_model_path()))
    await texts.ensure()
    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    lone = next(i for i in range(tokenizer.get_vocab_size()) if bytes(texts.bytes(i)) == b"\xc3")
    ids = [*tokenizer.encode(" thou", add_special_tokens=False).ids, lone]
    ids += tokenizer.encode("st not", add_special_tokens=False).ids
    text = tokenizer.decode(ids)
    assert "\ufffd" in text
    offsets = text_offsets(SimpleNamespace(tokens=texts), ids, TextCursor(), True)  # type: ignore[arg-type]
    assert offsets == sorted(offsets)
    for t, at in zip(ids, offsets, strict=True):
        piece = bytes(texts.bytes(t)).decode("utf-8", "replace")
        assert text[at : at + len(piece)] == piece, (piece, at, text)

"""``text_offsets`` over the default model's own vocabulary (rt.http.tokens, as
the server loads it), for texts the detokenizer makes that a server cannot be
made to produce at will."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tokenizers import Tokenizer

from rt.assets import default_model_path
from rt.http.openai_api import _echoes
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


async def test_echo_decodes_no_prompt_longer_than_the_context_that_nothing_cuts() -> None:
    """/v1/completions' echo decoded a prompt of ids before the engine refused it
    as too long: 7M ids held the event loop 4 s. The engine refuses such a prompt,
    so its text is never needed; a prompt the server will cut is decoded."""
    texts = TokenTexts(str(default_model_path()))
    await texts.ensure()
    front = SimpleNamespace(tokens=texts, context_length=8)
    prompts: list[Any] = ["some text", [65] * 9, [65] * 3]
    kept = _echoes(front, prompts, cut=False)  # type: ignore[arg-type]
    assert kept == ["some text", "", texts.decode([65] * 3)] and kept[2]
    assert _echoes(front, prompts, cut=True)[1] == texts.decode([65] * 9)  # type: ignore[arg-type]


async def test_a_sentencepiece_words_offset_counts_its_space(tmp_path: Path) -> None:
    """A Llama-2 style vocabulary ("▁the", a decoder that strips the text's first
    space): each word's token decoded alone lost its space, so each offset after
    one pointed a character earlier than the last."""
    from tokenizers import decoders, models, normalizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    words = "Q: go the quick brown fox jumps over the lazy dog"
    tokenizer.train_from_iterator(
        [words] * 50, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>"])
    )
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    texts = TokenTexts(str(tmp_path))
    await texts.ensure()
    prompt = tokenizer.encode("Q: go").ids
    ids = tokenizer.encode("the quick brown fox").ids
    assert tokenizer.id_to_token(ids[0]).startswith("\u2581")
    # the text as the detokenizer makes it: after the prompt's, its first space kept
    text = tokenizer.decode(prompt + ids)[len(tokenizer.decode(prompt)) :]
    assert text == " the quick brown fox"
    offsets = text_offsets(SimpleNamespace(tokens=texts), ids, TextCursor(), True, text)  # type: ignore[arg-type]
    for t, at in zip(ids, offsets, strict=True):
        piece = bytes(texts.bytes(t)).decode()
        assert text[at : at + len(piece)] == piece, (piece, at, text, offsets)
    assert offsets[-1] + len(bytes(texts.bytes(ids[-1]))) == len(text)

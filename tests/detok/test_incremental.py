"""Incremental detokenization against the tokenizer's own decode."""

from __future__ import annotations

import random

import pytest

from rt.detok.incremental import DetokParams, IncrementalDetokenizer, TokenUpdate

TEXTS = [
    "Hello there, how are you?",
    "emoji 😀🎉 family 👩‍👩‍👧 flags 🇫🇷🇯🇵 done",
    "日本語の文章。東京です",
    "e\u0301 a\u0308 n\u0303 café naïve",
    "🎉",
]


def stream(detok: IncrementalDetokenizer, rid: str, ids: list[int], chunks: list[int]):
    deltas, pos = [], 0
    for n in chunks:
        piece = ids[pos : pos + n]
        last = pos + n >= len(ids)
        deltas += detok.step([TokenUpdate(rid, pos, piece, finished=last)])
        pos += n
    return deltas


def random_chunks(n: int, rng: random.Random) -> list[int]:
    chunks = []
    while sum(chunks) < n:
        chunks.append(rng.randint(1, 3))
    return chunks


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunking", ["one", "random"])
def test_joined_deltas_equal_decode(tokenizer, text: str, chunking: str) -> None:
    ids = tokenizer.encode(text)
    assert len(ids) > len(text.encode()) // 4, "the tokenizer should split characters"
    detok = IncrementalDetokenizer(tokenizer)
    detok.open("r", tokenizer.encode("Prompt:"), DetokParams())
    chunks = [1] * len(ids) if chunking == "one" else random_chunks(len(ids), random.Random(1))
    deltas = stream(detok, "r", ids, chunks)
    assert "".join(d.text for d in deltas) == tokenizer.decode(ids)
    assert all("\ufffd" not in d.text for d in deltas), "half a character was emitted"
    offsets = [d.text_offset for d in deltas]
    assert offsets == sorted(offsets) and deltas[-1].finished


def test_many_requests_in_one_batch(tokenizer) -> None:
    detok = IncrementalDetokenizer(tokenizer)
    all_ids = {f"r{i}": tokenizer.encode(t) for i, t in enumerate(TEXTS)}
    for rid in all_ids:
        detok.open(rid, [], DetokParams())
    out = {rid: "" for rid in all_ids}
    for pos in range(max(len(v) for v in all_ids.values())):
        updates = [
            TokenUpdate(rid, pos, ids[pos : pos + 1], finished=pos == len(ids) - 1)
            for rid, ids in all_ids.items()
            if pos < len(ids)
        ]
        for delta in detok.step(updates):
            out[delta.rid] += delta.text
    assert out == {rid: tokenizer.decode(ids) for rid, ids in all_ids.items()}


@pytest.mark.parametrize("stop", ["fox jumps", "😀", "Hel"])
def test_nothing_at_or_after_a_stop_string_is_emitted(tokenizer, stop: str) -> None:
    text = "Hello the quick fox jumps 😀 over"
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer)
    detok.open("r", [], DetokParams(stop=(stop,)))
    deltas = []
    for pos in range(len(ids)):
        deltas += detok.step([TokenUpdate("r", pos, ids[pos : pos + 1])])
        if deltas and deltas[-1].finished:
            break
    assert "".join(d.text for d in deltas) == text[: text.index(stop)]
    assert deltas[-1].stop_matched == stop and deltas[-1].finished
    assert detok.step([TokenUpdate("r", pos + 1, ids[pos + 1 :])]) == []


@pytest.mark.parametrize("how", ["token by token", "in one update", "rebuilt"])
def test_stop_strings_count_from_min_new_tokens_on(tokenizer, how: str) -> None:
    """As vLLM's ``min_tokens``: a stop string in the text of the first
    ``min_new_tokens`` - 1 tokens is emitted as text; one after ends it. Also
    when one update carries tokens from both sides, as a restarted detokenizer's
    rebuild of a request from all its tokens at once (which used to match the
    early stop string, and end the request there)."""
    text = "the cat and the dog and the end"
    ids = tokenizer.encode(text)
    head = "the cat and the dog"
    first_after = len(tokenizer.encode(head))  # tokens up to the 2nd " and"
    params = DetokParams(stop=(" and",), min_new_tokens=first_after)
    detok = IncrementalDetokenizer(tokenizer)
    detok.open("r", [], params, prior_ids=ids[:first_after] if how == "rebuilt" else ())
    if how == "in one update":
        deltas = detok.step([TokenUpdate("r", 0, ids)])
    else:
        deltas = []
        for pos in range(first_after if how == "rebuilt" else 0, len(ids)):
            deltas += detok.step([TokenUpdate("r", pos, ids[pos : pos + 1])])
            if deltas and deltas[-1].finished:
                break
    emitted = head if how == "rebuilt" else ""  # a rebuild counts its prior text as emitted
    assert emitted + "".join(d.text for d in deltas) == head
    assert deltas[-1].stop_matched == " and" and deltas[-1].finished


def test_a_stop_string_inside_the_first_token(tokenizer) -> None:
    ids = tokenizer.encode("The quick")
    detok = IncrementalDetokenizer(tokenizer)
    detok.open("r", [], DetokParams(stop=("The",)))
    (delta,) = detok.step([TokenUpdate("r", 0, ids)])
    assert (delta.text, delta.stop_matched, delta.finished) == ("", "The", True)


def test_a_duplicated_update_emits_nothing_twice(tokenizer) -> None:
    ids = tokenizer.encode("Hello there")
    detok = IncrementalDetokenizer(tokenizer)
    detok.open("r", [], DetokParams())
    first = detok.step([TokenUpdate("r", 0, ids[:3])])
    again = detok.step([TokenUpdate("r", 0, ids[:3])])
    assert first[0].text and again == []
    overlap = detok.step([TokenUpdate("r", 2, ids[2:], finished=True)])
    assert first[0].text + overlap[0].text == "Hello there"
    assert overlap[0].token_offset == 3


def test_a_gap_in_the_tokens_is_an_error(tokenizer) -> None:
    detok = IncrementalDetokenizer(tokenizer)
    detok.open("r", [], DetokParams())
    with pytest.raises(ValueError, match="lost frame"):
        detok.step([TokenUpdate("r", 5, [1, 2])])


@pytest.mark.parametrize("cut", range(1, 12))
def test_a_rebuilt_detokenizer_continues_without_duplicate_or_missing_text(
    tokenizer, cut: int
) -> None:
    """The frontend merges deltas by text_offset: a successor that is opened with
    the ids the frontend holds yields exactly the rest of the text."""
    text = "emoji 😀🎉 日本 café"
    ids = tokenizer.encode(text)
    first = IncrementalDetokenizer(tokenizer)
    first.open("r", [], DetokParams())
    received = ""
    for pos in range(cut):
        for d in first.step([TokenUpdate("r", pos, ids[pos : pos + 1])]):
            received = merge(received, d.text_offset, d.text)
    # The detokenizer dies; its successor is rebuilt from the ids the frontend has,
    # and the scheduler's frames from `cut - 2` on are delivered again.
    second = IncrementalDetokenizer(tokenizer)
    second.open("r", [], DetokParams(), prior_ids=ids[:cut])
    for pos in range(max(0, cut - 2), len(ids)):
        update = TokenUpdate("r", pos, ids[pos : pos + 1], finished=pos == len(ids) - 1)
        for d in second.step([update]):
            received = merge(received, d.text_offset, d.text)
    assert received == text


def merge(have: str, offset: int, text: str) -> str:
    """What the frontend does with a delta: keep only characters it lacks."""
    assert offset <= len(have), "a gap in the text"
    return have + text[len(have) - offset :]


def test_special_tokens_kept_show_as_a_fast_tokenizer_decodes_them(tokenizer) -> None:
    """No space set beside a special token shown (slow tokenizers set them with
    ``spaces_between_special_tokens``: vLLM's and SGLang's fast path does not)."""
    ids = [*tokenizer.encode("Hello"), tokenizer.eos_token_id, *tokenizer.encode("there")]
    for skip, want in [(True, "Hellothere"), (False, "Hello<|end|>there")]:
        assert tokenizer.decode(ids, skip_special_tokens=skip) == want
        detok = IncrementalDetokenizer(tokenizer)
        detok.open("r", [], DetokParams(skip_special_tokens=skip))
        deltas = stream(detok, "r", ids, [1] * len(ids))
        assert "".join(d.text for d in deltas) == want


def test_opening_an_open_request_merges_its_prior_output(tokenizer) -> None:
    ids = tokenizer.encode("Hello there friend")
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.open("r", [], DetokParams()) == []  # a redelivered open, with no output
    (delta,) = detok.open("r", [], DetokParams(), prior_ids=ids[:3])  # the rebuild
    assert delta.text == tokenizer.decode(ids[:3]) and delta.token_offset == 0
    assert detok.open("r", [], DetokParams(), prior_ids=ids[:3]) == []
    (rest,) = detok.step([TokenUpdate("r", 3, ids[3:], finished=True)])
    assert delta.text + rest.text == "Hello there friend"


@pytest.mark.parametrize("keep", [False, True], ids=["trimmed", "no_stop_trim"])
@pytest.mark.parametrize("chunking", ["one", "whole"])
def test_a_stop_token_that_ends_the_request_is_in_its_ids_not_its_text(
    tokenizer, keep: bool, chunking: str
) -> None:
    """As vLLM (unless include_stop_str_in_output) and SGLang (unless no_stop_trim)
    have it: the stop token's text was emitted, and the text of a request stopped
    by ``stop_token_ids`` ended with the very token asked to stop it."""
    ids = tokenizer.encode("And the king said unto them")
    detok = IncrementalDetokenizer(tokenizer)
    detok.open("r", tokenizer.encode("Prompt:"), DetokParams(no_stop_trim=keep))
    sizes = [1] * len(ids) if chunking == "one" else [len(ids)]
    deltas, pos = [], 0
    for n in sizes:
        last = pos + n == len(ids)
        update = TokenUpdate("r", pos, ids[pos : pos + n], finished=last, stop_token=last)
        deltas += detok.step([update])
        pos += n
    text = "".join(d.text for d in deltas)
    assert text == tokenizer.decode(ids if keep else ids[:-1])
    assert [t for d in deltas for t in d.ids] == ids and deltas[-1].finished
    assert detok.output_len("r") == len(ids)
    assert detok.step([TokenUpdate("r", len(ids) - 1, ids[-1:], True, True)]) == []

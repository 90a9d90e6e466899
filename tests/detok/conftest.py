from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Once upon a time there was a tiny model that served requests.",
    "日本語の文章を書きます。東京は大きい都市です。",
    "Emoji: 😀🎉👩‍👩‍👧 and flags 🇫🇷🇯🇵 appear here.",
    "Combining: e\u0301 a\u0308 n\u0303 — café naïve résumé.",
]


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE small enough that multi-byte characters split across tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|end|>", "<|user|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|end|>", additional_special_tokens=["<|user|>"]
    )

"""A byte-level BPE tokenizer trained in a blink, for tests: small enough that
multi-byte characters split across tokens, with special and chat tokens."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Once upon a time there was a tiny model that served requests.",
    "日本語の文章を書きます。東京は大きい都市です。",
    "Emoji: 😀🎉👩‍👩‍👧 and flags 🇫🇷🇯🇵 appear here.",
    "Combining: e\u0301 a\u0308 n\u0303 — café naïve résumé.",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|end|>",
        additional_special_tokens=specials[1:],
        chat_template=CHAT_TEMPLATE,
    )

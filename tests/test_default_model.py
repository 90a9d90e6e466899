"""The tiny default model in rt/assets loads offline and writes English."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)

from rt.assets import default_model_path

WORD_LIST = Path(__file__).parent / "data" / "kjv_words.txt"
PROMPTS = ("And God said", "In the beginning", "Hello, my name is")
NEW_TOKENS = 32
MIN_ENGLISH = 0.8  # fraction of generated words found in the corpus word list
MIN_WORDS = 12
MIN_DISTINCT_WORDS = 6
WORD_RE = re.compile(r"[A-Za-z]+")


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    # A 4M-parameter model gains nothing from intra-op threads, and on a busy
    # machine their synchronisation makes generate() ~10x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(default_model_path())


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    model = AutoModelForCausalLM.from_pretrained(default_model_path(), dtype=torch.float32)
    assert isinstance(model, LlamaForCausalLM)
    return model.eval()


@pytest.fixture(scope="module")
def known_words() -> frozenset[str]:
    return frozenset(WORD_LIST.read_text(encoding="utf-8").split())


def greedy_continuation(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, prompt: str
) -> str:
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        # transformers types generate()'s self as a protocol its own models fail to match.
        out = model.generate(  # type: ignore[misc]
            **inputs, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS
        )
    return str(tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))


def looks_english(text: str, known_words: frozenset[str]) -> bool:
    """A run of varied words, nearly all of them from the corpus's vocabulary.

    Both parts are needed: random token ids decode to fragments that miss the
    word list, while untrained weights greedily repeat one whole-word token.
    """
    words = [w.lower() for w in WORD_RE.findall(text)]
    if len(words) < MIN_WORDS or len(set(words)) < MIN_DISTINCT_WORDS:
        return False
    return sum(w in known_words for w in words) / len(words) >= MIN_ENGLISH


def test_model_and_tokenizer_load_offline(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase
) -> None:
    weights = default_model_path() / "model.safetensors"
    assert weights.stat().st_size <= 10 * 1024 * 1024
    config = model.config
    assert isinstance(config, LlamaConfig)
    assert config.num_key_value_heads is not None
    assert config.num_key_value_heads < config.num_attention_heads  # GQA is exercised
    assert config.vocab_size == len(tokenizer)
    assert tokenizer.eos_token == "<|end|>"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_tokenizer_round_trips_any_utf8(tokenizer: PreTrainedTokenizerBase) -> None:
    text = "naïve café — 東京 🙂 and the LORD said\n\ttabs"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_chat_template_renders_messages(tokenizer: PreTrainedTokenizerBase) -> None:
    messages = [
        {"role": "system", "content": "Answer in the style of the King James Bible."},
        {"role": "user", "content": "Who made the heaven and the earth?"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|bos|><|system|>\nAnswer in the style of the King James Bible.<|end|>\n"
        "<|user|>\nWho made the heaven and the earth?<|end|>\n<|assistant|>\n"
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    for token in ("<|bos|>", "<|system|>", "<|user|>", "<|end|>", "<|assistant|>"):
        assert tokenizer.convert_tokens_to_ids(token) in ids  # one id, not split into bytes


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_continuation_is_english(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    known_words: frozenset[str],
    prompt: str,
) -> None:
    text = greedy_continuation(model, tokenizer, prompt)
    assert looks_english(text, known_words), f"{prompt!r} continued as {text!r}"


def test_english_check_rejects_noise(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, known_words: frozenset[str]
) -> None:
    # The check above must be able to fail: on random token ids, and on untrained weights.
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        ids = torch.randint(0, len(tokenizer), (NEW_TOKENS,), generator=gen)
        text = str(tokenizer.decode(ids, skip_special_tokens=True))
        assert not looks_english(text, known_words), text
    torch.manual_seed(0)
    config = model.config
    assert isinstance(config, LlamaConfig)
    untrained = LlamaForCausalLM(config).eval()
    for prompt in PROMPTS:
        text = greedy_continuation(untrained, tokenizer, prompt)
        assert not looks_english(text, known_words), text

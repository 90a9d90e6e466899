"""A tiny Llama checkpoint with its own trained tokenizer, saved the way Hugging
Face saves models, so the pipeline loads it through its real loading code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from tiny_tokenizer import make_tokenizer


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(path)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.5,  # well-separated logits: greedy ties are not an issue
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path

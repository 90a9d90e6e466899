from __future__ import annotations

import pytest
from tiny_tokenizer import make_tokenizer
from transformers import PreTrainedTokenizerFast


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer()

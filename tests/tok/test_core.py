"""The tokenizer worker's core: prompts to validated ids, each request alone."""

from __future__ import annotations

import numpy as np
import pytest

from rt.gpu.sampling_params import SamplingParams
from rt.messages import GenerateRequest, Refused
from rt.tok.core import TokenizerCore


@pytest.fixture
def core(tokenizer) -> TokenizerCore:
    return TokenizerCore(tokenizer, context_length=256, vocab_size=len(tokenizer))


def test_text_ids_and_chat_in_one_batch(core, tokenizer) -> None:
    messages = ({"role": "user", "content": "Hello there"},)
    reqs = [
        GenerateRequest("a", text="The quick brown fox"),
        GenerateRequest("b", input_ids=(5, 6, 7)),
        GenerateRequest("c", messages=messages),
    ]
    (a, ta), (b, _), (c, _) = core.process(reqs)
    assert a.input_ids.tolist() == tokenizer.encode("The quick brown fox")
    assert ta.input_ids is a.input_ids and ta.truncated == 0
    assert b.input_ids.tolist() == [5, 6, 7] and b.input_ids.dtype == np.int64
    rendered = "<|user|>Hello there<|end|><|assistant|>"
    assert tokenizer.decode(c.input_ids) == rendered
    assert c.input_ids.tolist() == tokenizer.encode(rendered, add_special_tokens=False)


def test_a_bad_request_is_refused_alone(core) -> None:
    reqs = [
        GenerateRequest("ok", text="fine"),
        GenerateRequest("two", text="x", input_ids=(1,)),
        GenerateRequest("range", input_ids=(1, 10_000)),
        GenerateRequest("temp", text="x", sampling=SamplingParams(temperature=-1.0)),
        GenerateRequest("empty", input_ids=()),
        GenerateRequest("chat", messages=({"content": "no role"},)),
        GenerateRequest("ok2", text="also fine"),
    ]
    results = core.process(reqs)
    refused = {r.rid: r for r in results if isinstance(r, Refused)}
    assert [r[0].rid for r in results if not isinstance(r, Refused)] == ["ok", "ok2"]
    assert "exactly one of text, input_ids or messages" in refused["two"].message
    assert "expected token ids in [0," in refused["range"].message
    assert "temperature" in refused["temp"].message
    assert "empty" in refused["empty"].message
    assert "'role' and 'content'" in refused["chat"].message
    assert {r.error for r in refused.values()} == {"InvalidRequestError"}


def test_context_overflow_is_refused_or_truncated(core, tokenizer) -> None:
    long = list(range(10, 70))  # 60 tokens + 200 new > 256
    sampling = SamplingParams(max_new_tokens=200)
    (refused,) = core.process([GenerateRequest("r", input_ids=tuple(long), sampling=sampling)])
    assert isinstance(refused, Refused) and refused.error == "ContextOverflowError"
    assert "allow_auto_truncate" in refused.message
    ((sched, tok),) = core.process(
        [GenerateRequest("t", input_ids=tuple(long), sampling=sampling, allow_auto_truncate=True)]
    )
    assert sched.input_ids.tolist() == long[4:] and tok.truncated == 4


def test_a_model_without_chat_template_says_so(tokenizer) -> None:
    tokenizer = type(tokenizer)(tokenizer_object=tokenizer.backend_tokenizer)
    core = TokenizerCore(tokenizer, context_length=64, vocab_size=len(tokenizer))
    (refused,) = core.process([GenerateRequest("c", messages=({"role": "user", "content": "hi"},))])
    assert isinstance(refused, Refused) and "no chat template" in refused.message

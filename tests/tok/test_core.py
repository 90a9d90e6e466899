"""The tokenizer worker's core: prompts to validated ids, each request alone."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from rt.assets import default_model_path
from rt.errors import ContextOverflowError
from rt.gpu.sampling_params import SamplingParams
from rt.messages import GenerateRequest, Refused
from rt.tok.core import Result, TokenizerCore


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


def test_add_special_tokens_overrides_what_a_text_or_a_chat_gets() -> None:
    """vLLM's per-request ``add_special_tokens``, with the default model's tokenizer
    (it puts a BOS before a text; its chat template writes its own)."""
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    core = TokenizerCore(tokenizer, context_length=256, vocab_size=len(tokenizer))
    bos = tokenizer.bos_token_id
    messages = ({"role": "user", "content": "Hello there"},)
    reqs = [
        GenerateRequest("text", text="The fox"),
        GenerateRequest("bare", text="The fox", add_special_tokens=False),
        GenerateRequest("chat", messages=messages),
        GenerateRequest("chat+", messages=messages, add_special_tokens=True),
    ]
    (text, _), (bare, _), (chat, _), (chat_bos, _) = core.process(reqs)
    assert text.input_ids[0] == bos and text.input_ids[1:].tolist() == bare.input_ids.tolist()
    assert bos not in bare.input_ids.tolist()
    assert (
        chat_bos.input_ids[0] == bos and chat_bos.input_ids[1:].tolist() == chat.input_ids.tolist()
    )


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
    whole = SamplingParams(max_new_tokens=256)  # the budget alone fills the context
    (refused,) = core.process(
        [GenerateRequest("w", input_ids=(5,), sampling=whole, allow_auto_truncate=True)]
    )
    assert isinstance(refused, Refused) and refused.error == "ContextOverflowError"
    assert refused.message.endswith("; lower max_new_tokens"), refused.message
    # a prompt over the context as well: the cut cannot help either (it said "shorten the prompt")
    over = [7] * 300
    (refused,) = core.process(
        [GenerateRequest("w2", input_ids=tuple(over), sampling=whole, allow_auto_truncate=True)]
    )
    assert refused.message.startswith("max_new_tokens is 256, which leaves no room"), refused
    assert refused.message.endswith("; lower max_new_tokens"), refused.message


def test_a_prompt_that_fills_the_context_is_not_said_to_be_over_it(core) -> None:
    one = SamplingParams(max_new_tokens=1)
    said = {}
    for size in (256, 257):
        (refused,) = core.process([GenerateRequest("f", input_ids=(5,) * size, sampling=one)])
        assert isinstance(refused, Refused) and refused.error == "ContextOverflowError"
        said[size] = refused.message
    assert said[256].startswith("the prompt has 256 tokens, the whole context length 256 on")
    assert said[257].startswith("the prompt has 257 tokens, over the context length 256 on")


def test_truncate_prompt_tokens_keeps_the_last_tokens_of_a_text(core, tokenizer) -> None:
    text = "a b c d e f g h i j k l"
    full = tokenizer.encode(text)
    ((sched, tok),) = core.process([GenerateRequest("k", text=text, keep_last=4)])
    assert sched.input_ids.tolist() == full[-4:] and tok.truncated == len(full) - 4
    # then the room max_new_tokens leaves: the context is 256
    sampling = SamplingParams(max_new_tokens=254)
    ((sched, tok),) = core.process(
        [
            GenerateRequest(
                "both", text=text, keep_last=4, sampling=sampling, allow_auto_truncate=True
            )
        ]
    )
    assert sched.input_ids.tolist() == full[-2:] and tok.truncated == len(full) - 2
    (refused,) = core.process([GenerateRequest("over", text=text, keep_last=4, sampling=sampling)])
    assert isinstance(refused, Refused) and refused.error == "ContextOverflowError"
    # a text past any tokenization's bound is cut before it is encoded, not refused
    ((sched, _),) = core.process([GenerateRequest("huge", text="a " * 4_000_000, keep_last=3)])
    assert len(sched.input_ids) == 3 and set(tokenizer.decode(sched.input_ids).split()) == {"a"}


def test_prompt_logprobs_from_a_position_past_the_prompt_are_refused(core) -> None:
    def asking(rid: str, start: int, logprobs: bool = True) -> GenerateRequest:
        sampling = SamplingParams(prompt_logprobs=logprobs, logprob_start_len=start)
        return GenerateRequest(rid, input_ids=(5, 6, 7), sampling=sampling)

    results = core.process(
        [asking("last", 2), asking("past", 3), asking("unasked", 3, False), asking("neg", -1)]
    )
    refused = {r.rid: r.message for r in results if isinstance(r, Refused)}
    assert set(refused) == {"past", "neg"}  # from the last position on it is fine
    assert (
        "logprob_start_len: expected a position in the prompt, below its 3 tokens, got 3"
        in (refused["past"])
    )
    assert "logprob_start_len" in refused["neg"]


def test_a_text_too_long_for_any_tokenization_is_refused_or_cut_before_encoding(
    core, tokenizer
) -> None:
    # A text of megabytes took the tokenizer longer than the watchdog allows (it was
    # killed, restarted, sent the text again, ...); past context x the longest token's
    # bytes, no tokenization can fit it, so it is refused before it is encoded.
    longest = max(len(t.encode()) for t in tokenizer.get_vocab())
    assert core.max_text_bytes == 256 * longest
    huge = "a " * 4_000_000  # 8 MB
    called: list[int] = []  # the longest text each encoding was given
    encode = core._encode

    def spy(texts: dict[int, str], plain: dict[int, bool]) -> Any:
        called.append(max((len(t) for t in texts.values()), default=0))
        return encode(texts, plain)

    core._encode = spy  # type: ignore[method-assign]
    (refused,) = core.process([GenerateRequest("big", text=huge)])
    assert isinstance(refused, Refused) and refused.error == "ContextOverflowError"
    assert f"the prompt is {len(huge)} bytes" in refused.message
    assert called == [0]  # nothing was encoded
    sampling = SamplingParams(max_new_tokens=6)
    ((sched, tok),) = core.process(
        [GenerateRequest("cut", text=huge, sampling=sampling, allow_auto_truncate=True)]
    )
    assert called[-1] <= core.max_text_bytes  # only the end was encoded
    assert len(sched.input_ids) == 250 and tok.truncated > 0
    assert tokenizer.decode(sched.input_ids).strip().endswith("a a a")
    # a text within the bound is tokenized as before
    ((ok, _),) = core.process([GenerateRequest("ok", text="a " * 50)])
    assert ok.input_ids.tolist() == tokenizer.encode("a " * 50)


def test_a_model_without_chat_template_says_so(tokenizer) -> None:
    tokenizer = type(tokenizer)(tokenizer_object=tokenizer.backend_tokenizer)
    core = TokenizerCore(tokenizer, context_length=64, vocab_size=len(tokenizer))
    (refused,) = core.process([GenerateRequest("c", messages=({"role": "user", "content": "hi"},))])
    assert isinstance(refused, Refused) and "no chat template" in refused.message


class Picky:
    """The real tokenizer, except that any call holding ``bad`` raises (as the Rust
    binding does on a text it cannot take); ``calls`` records each call's texts."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast, bad: str) -> None:
        self.tokenizer, self.bad = tokenizer, bad
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str], **kwargs: Any) -> Any:
        self.calls.append(list(texts))
        if any(self.bad in t for t in texts):
            raise RuntimeError("the tokenizer failed")
        return self.tokenizer(texts, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


def ids_of(result: Result) -> list[int]:
    assert not isinstance(result, Refused), result
    return result[0].input_ids.tolist()


def refusal_of(result: Result) -> Refused:
    assert isinstance(result, Refused), result
    return result


def test_a_text_the_tokenizer_raises_on_is_refused_alone(core, tokenizer) -> None:
    # A lone surrogate makes the real (Rust) tokenizer raise TypeError, for the
    # whole batched call: the texts are then encoded one by one.
    messages = ({"role": "user", "content": "a \ud800 in a chat"},)
    reqs = [
        GenerateRequest("ok", text="fine"),
        GenerateRequest("surrogate", text="a \ud800 b"),
        GenerateRequest("chat", messages=messages),
        GenerateRequest("ids", input_ids=(5, 6)),
        GenerateRequest("ok2", text="also fine"),
    ]
    ok, surrogate, chat, ids, ok2 = core.process(reqs)
    for refused, rid in ((refusal_of(surrogate), "surrogate"), (refusal_of(chat), "chat")):
        assert (refused.rid, refused.error) == (rid, "InvalidRequestError")
        assert "could not encode the prompt (TypeError" in refused.message
    assert ids_of(ok) == tokenizer.encode("fine")
    assert ids_of(ok2) == tokenizer.encode("also fine")
    assert ids_of(ids) == [5, 6]


def test_a_raising_batch_call_is_retried_text_by_text(tokenizer) -> None:
    picky = Picky(tokenizer, bad="BAD")
    core = TokenizerCore(picky, context_length=256, vocab_size=len(tokenizer))
    reqs = [GenerateRequest(t, text=t) for t in ("one", "BAD two", "three")]
    one, two, three = core.process(reqs)
    assert picky.calls == [["one", "BAD two", "three"], ["one"], ["BAD two"], ["three"]]
    assert "RuntimeError: the tokenizer failed" in refusal_of(two).message
    assert ids_of(one) == tokenizer.encode("one")
    assert ids_of(three) == tokenizer.encode("three")
    (fine,) = core.process([GenerateRequest("fine", text="fine")])
    assert ids_of(fine) == tokenizer.encode("fine")
    assert picky.calls[-1] == ["fine"]  # a batch that encodes is one call


def test_any_exception_a_request_causes_is_its_refusal(core, tokenizer) -> None:
    # Fields of the wrong type get here only from a frame that bypassed the
    # frontend's checks (a pickled request); whatever they raise, the request
    # is refused alone and the rest of the batch goes on.
    reqs = [
        GenerateRequest("ids", input_ids=5),  # type: ignore[arg-type]
        GenerateRequest("messages", messages=7),  # type: ignore[arg-type]
        GenerateRequest("sampling", text="x", sampling=None),  # type: ignore[arg-type]
        GenerateRequest("ok", text="fine"),
    ]
    *bad, ok = core.process(reqs)
    refused = [refusal_of(r) for r in bad]
    assert [r.rid for r in refused] == ["ids", "messages", "sampling"]
    assert {r.error for r in refused} == {"RequestFailedError"}
    assert "request ids could not be tokenized: TypeError" in refused[0].message
    assert ids_of(ok) == tokenizer.encode("fine")


def test_a_chat_template_that_raises_refuses_its_request(tokenizer) -> None:
    tokenizer = type(tokenizer)(tokenizer_object=tokenizer.backend_tokenizer)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('no tool messages') }}{% endif %}{{ m['content'] }}{% endfor %}"
    )
    core = TokenizerCore(tokenizer, context_length=256, vocab_size=len(tokenizer))
    reqs = [
        GenerateRequest("tool", messages=({"role": "tool", "content": "hi"},)),
        GenerateRequest("user", messages=({"role": "user", "content": "hi"},)),
    ]
    tool, user = core.process(reqs)
    assert isinstance(tool, Refused) and tool.error == "InvalidRequestError"
    assert "the chat template failed: no tool messages" in tool.message
    assert ids_of(user) == tokenizer.encode("hi", add_special_tokens=False)


def test_a_developer_message_is_a_system_one_where_the_template_knows_no_developer(
    tokenizer,
) -> None:
    """OpenAI's newer clients send the system prompt as role "developer"; a
    template that knows only system/user/assistant refused the request."""
    tokenizer = type(tokenizer)(tokenizer_object=tokenizer.backend_tokenizer)
    known = "{% if m['role'] not in ['system', 'user'] %}{{ raise_exception('role ' + m['role']) }}{% endif %}"
    tokenizer.chat_template = (
        "{% for m in messages %}" + known + "[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    )
    core = TokenizerCore(tokenizer, context_length=256, vocab_size=len(tokenizer))
    dev = ({"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"})
    sysm = ({"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"})
    tool = ({"role": "developer", "content": "x"}, {"role": "tool", "content": "hi"})
    as_dev, as_sys, bad = core.process(
        [
            GenerateRequest("d", messages=dev),
            GenerateRequest("s", messages=sysm),
            GenerateRequest("t", messages=tool),
        ]
    )
    assert ids_of(as_dev) == ids_of(as_sys)
    assert isinstance(bad, Refused) and "role tool" in bad.message
    # a template that knows the role keeps it
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'developer' %}D{% endif %}"
        "({{ m['role'] }}){% endfor %}"
    )
    (kept,) = TokenizerCore(tokenizer, context_length=256, vocab_size=len(tokenizer)).process(
        [GenerateRequest("k", messages=dev)]
    )
    assert tokenizer.decode(ids_of(kept)).replace(" ", "") == "D(developer)(user)"


def test_the_chat_templates_variables_come_from_the_request(tokenizer) -> None:
    """``chat_template_kwargs`` (vLLM's and SGLang's: Qwen3's ``enable_thinking``,
    ``reasoning_effort``, …); ``continue_final_message`` leaves the last message
    open and asks for no new turn."""
    tokenizer = type(tokenizer)(tokenizer_object=tokenizer.backend_tokenizer)
    tokenizer.chat_template = (
        "{% if reasoning_effort %}effort {{ reasoning_effort }}. {% endif %}"
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}"
        "{% if not (loop.last and continue_final_message) %}[end]{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]"
        "{% if enable_thinking is defined and not enable_thinking %}no thinking{% endif %}"
        "{% endif %}"
    )
    core = TokenizerCore(tokenizer, context_length=256, vocab_size=len(tokenizer))
    chat = ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once"})
    variables: list[dict[str, Any] | None] = [
        None,
        {"enable_thinking": False, "reasoning_effort": "high"},
        {"continue_final_message": True},
        {"add_generation_prompt": False},
    ]
    results = core.process(
        [GenerateRequest(str(i), messages=chat, template_kwargs=v) for i, v in enumerate(variables)]
    )
    rendered = [tokenizer.decode(ids_of(r)).replace(" ", "") for r in results]
    assert rendered == [
        "[user]hi[end][assistant]Once[end][assistant]",
        "efforthigh.[user]hi[end][assistant]Once[end][assistant]nothinking",
        "[user]hi[end][assistant]Once",
        "[user]hi[end][assistant]Once[end]",
    ]


def test_a_templates_error_is_said_in_at_most_a_thousand_characters(tokenizer) -> None:
    """A template's own error may quote the chat (``raise_exception(content)``):
    the refusal says its start and how long it was, not the whole of it."""
    tokenizer = type(tokenizer)(tokenizer_object=tokenizer.backend_tokenizer)
    tokenizer.chat_template = "{{ raise_exception('bad: ' + messages[0]['content']) }}"
    core = TokenizerCore(tokenizer, context_length=256, vocab_size=len(tokenizer))
    for content, whole in (("short", True), ("x" * 50_000, False)):
        (result,) = core.process(
            [GenerateRequest("r", messages=[{"role": "user", "content": content}])]
        )
        assert isinstance(result, Refused) and result.error == "InvalidRequestError"
        assert result.message.startswith("messages: the chat template failed: bad: ")
        assert len(result.message) < 1100
        assert whole == result.message.endswith("bad: short")
        assert whole or result.message.endswith("… (50005 characters)")


class Text(str):
    """A str a weak reference can follow: a text of the batch."""


def test_a_refusal_keeps_no_frame_of_its_batch_alive(core) -> None:
    """A refused request's error kept its traceback, whose frames reach the frame of
    the batch that keeps the error (the tokenizer's ``_tokenize``): a cycle that held
    the batch's frames and texts (~1 GB of a tokenizer for 8 MB prompts) until a full
    collection. Only the error's message is kept now."""

    def batch() -> tuple[weakref.ref[BaseException], weakref.ref[Text]]:
        reqs = [GenerateRequest(rid, text="") for rid in ("long", "bad", "fine")]
        texts: list[Any] = [core.text(GenerateRequest("long", text="word " * 100_000))]
        assert isinstance(texts[0], ContextOverflowError)
        texts += ["a lone surrogate \ud800, which no tokenizer encodes", Text("fine")]
        long, bad, fine = core.encode(reqs, texts)
        assert not isinstance(fine, Refused)
        assert isinstance(long, Refused) and "shorten the prompt" in long.message
        assert isinstance(bad, Refused) and "could not encode" in bad.message
        return weakref.ref(texts[0]), weakref.ref(texts[2])

    gc.collect()
    gc.disable()
    try:
        error, text = batch()
        assert error() is None and text() is None  # gone with the batch, no collection
    finally:
        gc.enable()


def test_a_chat_template_that_raises_keeps_no_frame_of_its_batch_alive() -> None:
    """Jinja rewrites a failing template's traceback into frames of its own, in a
    cycle whose ``f_back`` reached the batch: another request's text stayed alive
    till a full collection (the default model's template refuses a role "tool")."""
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    core = TokenizerCore(tokenizer, context_length=256, vocab_size=len(tokenizer))

    def batch() -> weakref.ref[Text]:
        other = Text("word " * 1000)
        reqs = [
            GenerateRequest("bad", messages=({"role": "tool", "content": "x"},)),
            GenerateRequest("other", text=other, allow_auto_truncate=True),
        ]
        bad, _ = core.process(reqs)
        assert isinstance(bad, Refused) and "the chat template failed" in bad.message
        return weakref.ref(other)

    gc.collect()
    gc.disable()
    try:
        assert batch()() is None  # gone with its batch, no collection needed
    finally:
        gc.enable()

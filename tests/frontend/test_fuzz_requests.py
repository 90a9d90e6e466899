"""Property: nothing a caller passes to ``generate`` or ``stream`` stops the engine.

Every request ends in a result (a finish reason for every sequence) or an
``InvalidRequestError`` (or a ``ContextOverflowError``, for a prompt or budget
too long for the context); no actor restarts; requests beside a bad one finish.
Any other exception is a failure, the other ``RequestError``s included:
``RequestFailedError`` means an actor died on the request, and
``ServiceUnavailableError`` or ``RequestAborted`` that one was down or lost it.

Each argument is drawn as a value to accept (extremes included: 64-bit
integers, float32's largest, subnormals), a value to refuse (wrong types,
numbers past 64 bits or out of range, NaN, lone surrogates, empty lists, junk
chat messages, unknown keys), or a budget too long for the context. A request
with exactly one refused argument must be refused naming it; one with none
must finish.

Design: hypothesis drives, trio serves. Opening an engine costs seconds (three
processes load torch), so everything shares one: the test calls ``trio.run``
once on the main thread (where the supervisor's signal handling works, as in
production) and opens the engine; a sweep sends every listed edge value of
every argument once; then the hypothesis test runs in a worker thread
(``trio.to_thread.run_sync``) and reaches the engine through
``trio.from_thread.run``. Hypothesis keeps its own loop (generation,
shrinking, the falsifying example in the failure), which pytest-trio's own
hypothesis support cannot give here: it runs each example in a fresh
``trio.run``, so an engine per example. An example is a batch of requests
submitted at once (the tokenizer batches them, so a bad one sits beside good
ones) plus a plain request that must finish. The engine runs the null model:
no forward pass, but sampling, tokenizing and detokenizing are real.
``derandomize=True`` makes CI reproducible; ``RT_FUZZ_EXAMPLES=3000`` explores
further from a random start.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
from hypothesis import given, note, settings
from hypothesis import strategies as st

import rt
from rt.config import EngineOptions
from rt.errors import ContextOverflowError, InvalidRequestError
from rt.frontend.chat import MAX_JSON_DEPTH
from rt.frontend.requests import OTHER_FIELDS, SAMPLING_FIELDS
from rt.gpu.sampling_params import FLOAT32_MAX, SEED_MASK

pytestmark = pytest.mark.slow

_, VOCAB = EngineOptions().model_limits()  # the default model's (4096); its context is 512
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
EXPLORE = int(os.environ.get("RT_FUZZ_EXAMPLES", "0"))
EXAMPLES = EXPLORE or 150
REQUEST_TIMEOUT = 60.0  # seconds; a request of the null model takes milliseconds
ENGINE_OPTIONS: dict[str, Any] = dict(
    load_format="null",
    max_crashes_per_request=1,  # a poison request fails at once (and the example with it)
    schedule_policy="priority",  # (under fcfs a priority other than 0 is refused)
)
PLAIN = "And God said"

OK, BAD, LONG = "ok", "bad", "long"  # LONG: may not fit the context (ContextOverflowError)
Tagged = tuple[Any, str]


@dataclass(frozen=True)
class Arg:
    """How to draw one argument (tagged with its verdict), and its edge values."""

    ok: st.SearchStrategy[Tagged]
    bad: st.SearchStrategy[Tagged]
    edges: tuple[Tagged, ...]

    @property
    def any(self) -> st.SearchStrategy[Tagged]:
        return self.ok | self.bad


def arg(
    ok: st.SearchStrategy[Any],
    bad: st.SearchStrategy[Any],
    ok_edges: Sequence[Any] = (),
    bad_edges: Sequence[Any] = (),
    long: Sequence[Any] = (),
) -> Arg:
    def tag(verdict: str, values: st.SearchStrategy[Any], edges: Sequence[Any]) -> Any:
        return (values | st.sampled_from(edges) if edges else values).map(lambda v: (v, verdict))

    accepted = tag(OK, ok, ok_edges)
    if long:  # a quarter of the time
        too_long = tag(LONG, st.sampled_from(long), ())
        accepted = st.integers(0, 3).flatmap(
            lambda i: too_long if i == 0 else tag(OK, ok, ok_edges)
        )
    edges = [(v, OK) for v in ok_edges] + [(v, BAD) for v in bad_edges] + [(v, LONG) for v in long]
    return Arg(accepted, tag(BAD, bad, bad_edges), tuple(edges))


# ---- values -------------------------------------------------------------------------------

LONE_SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
TEXT = st.text(max_size=12)  # hypothesis leaves surrogates out of text unless asked
UNICODE_JUNK = st.builds(lambda a, s, b: a + s + b, TEXT, LONE_SURROGATE, TEXT)
PAST_I64 = st.sampled_from([I64_MAX + 1, I64_MIN - 1, 1 << 64, 10**30, -(10**30), 10**400])
NOT_NUMBER = st.one_of(
    st.booleans(),
    TEXT,
    st.binary(max_size=3),
    st.lists(st.integers(0, 9), max_size=2),
    st.dictionaries(TEXT, st.integers(0, 9), max_size=1),
    st.complex_numbers(max_magnitude=2),
)
NOT_INT = st.one_of(st.none(), NOT_NUMBER, st.floats(), PAST_I64)
NOT_FLOAT = st.one_of(st.none(), NOT_NUMBER, st.sampled_from([math.nan, math.inf, -math.inf]))
NOT_BOOL = st.one_of(
    st.none(), st.integers(), st.floats(), TEXT, st.lists(st.booleans(), max_size=1)
)
BOOL_EDGES: dict[str, Any] = dict(ok_edges=[True, False], bad_edges=[0, 1, None, "true", "", 1.0])
PAST_FLOAT32 = [1e39, -1e39, 1e308, 10**39, 10**400]


def numbers(low: float, high: float) -> st.SearchStrategy[Any]:
    """Floats in [low, high], and ints there (JSON has one number type)."""
    return st.floats(low, high) | st.integers(math.ceil(low), math.floor(high))


def with_one(junk: st.SearchStrategy[Any], good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A list of good values with one junk value among them."""
    return st.builds(
        lambda a, j, b: [*a, j, *b], st.lists(good, max_size=3), junk, st.lists(good, max_size=3)
    )


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


TOKEN = st.integers(0, VOCAB - 1)
BAD_ID = st.sampled_from([-1, VOCAB, 1 << 64, 10**30, True, 1.0, "1", None]) | st.integers(
    max_value=-1
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(I64_MIN, I64_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)  # fmt: skip

# ---- the arguments ---------------------------------------------------------------------------


def sampling_args() -> dict[str, Arg]:
    penalty = arg(
        numbers(-2, 2),
        st.floats(min_value=2, exclude_min=True)
        | st.floats(max_value=-2, exclude_max=True)
        | st.integers(min_value=3)
        | st.integers(max_value=-3)
        | NOT_FLOAT,
        ok_edges=[-2, 2, -2.0, 2.0, 0],
        bad_edges=[2.0000001, -3, math.nan, math.inf, None, True, 10**400],
    )
    return {
        "max_new_tokens": arg(
            st.integers(1, 16),
            st.integers(max_value=0) | NOT_INT.filter(lambda v: v is not None),
            ok_edges=[1, None],  # None: the room the prompt leaves in the context
            bad_edges=[0, -1, I64_MAX + 1, 10**400, 8.0, "8", True],
            long=[600, 10**6, I64_MAX],  # past the context of 512, whatever the prompt
        ),
        "min_new_tokens": arg(
            st.integers(0, 1),
            st.integers(max_value=-1) | NOT_INT,
            ok_edges=[0, 1],
            bad_edges=[-1, 1.0, None, True, 10**30],
        ),
        "temperature": arg(
            numbers(0, 2),
            st.floats(max_value=-1e-300) | st.integers(max_value=-1) | NOT_FLOAT,
            ok_edges=[0, 0.0, 5e-324, 1e-46, 1e-300, 10**30, FLOAT32_MAX, (1 << 64) - 1],
            bad_edges=[-5e-324, -1, math.nan, math.inf, -math.inf, "1", None, True, 1j, *PAST_FLOAT32],
        ),
        "top_k": arg(
            st.integers(-1, 64) | st.integers(I64_MIN, I64_MAX),
            NOT_INT,
            ok_edges=[I64_MIN, I64_MAX, -1, 0, 1, VOCAB - 1, VOCAB, VOCAB + 1],
            bad_edges=[I64_MAX + 1, I64_MIN - 1, 1.0, "5", None, True],
        ),
        "top_p": arg(
            st.floats(0, 1, exclude_min=True),
            st.floats(max_value=0) | st.floats(min_value=1, exclude_min=True)
            | st.integers(max_value=0) | st.integers(min_value=2) | NOT_FLOAT,
            ok_edges=[5e-324, 1, 1.0, 0.5],
            bad_edges=[0, 0.0, -0.0, -1, 1.0000001, 2, math.nan, math.inf, None, True, "0.5"],
        ),
        "min_p": arg(
            numbers(0, 1),
            st.floats(max_value=-1e-300) | st.floats(min_value=1, exclude_min=True) | NOT_FLOAT,
            ok_edges=[0, 1, 0.0, 1.0, 5e-324],
            bad_edges=[-5e-324, 1.0000001, math.nan, None, False],
        ),
        "frequency_penalty": penalty,
        "presence_penalty": penalty,
        "repetition_penalty": arg(  # below 1e-6 the sampler's float32 overflowed
            st.floats(min_value=1e-6, max_value=FLOAT32_MAX) | st.integers(1, 10**30),
            st.floats(max_value=1e-6, exclude_max=True) | st.integers(max_value=0) | NOT_FLOAT,
            ok_edges=[1e-6, FLOAT32_MAX, 10**30, 1],
            bad_edges=[0, -1, 0.0, -0.0, 5e-324, 1e-46, 9.99e-7, math.nan, math.inf, None, True, *PAST_FLOAT32],
        ),
        "stop_token_ids": arg(
            st.none() | st.lists(TOKEN, max_size=4) | st.tuples(TOKEN),
            with_one(BAD_ID, TOKEN) | st.integers() | TEXT | st.dictionaries(TOKEN, TOKEN, max_size=1),
            ok_edges=[None, [], (), [0], [VOCAB - 1], list(range(VOCAB)), [1] * 100],
            bad_edges=[5, "1", "", [VOCAB], [-1], [True], [1.0], ["1"], [None], {1: 2}, {1}, [10**30]],
        ),
        "allowed_token_ids": arg(  # (empty: nothing could be drawn)
            st.none() | st.lists(TOKEN, min_size=1, max_size=4) | st.tuples(TOKEN),
            with_one(BAD_ID, TOKEN) | st.integers() | TEXT | st.just([]),
            ok_edges=[None, [0], [VOCAB - 1], list(range(VOCAB)), [1] * 100],
            bad_edges=[[], (), 5, "1", "", [VOCAB], [-1], [True], [1.0], ["1"], [None], {1}],
        ),
        "ignore_eos": arg(st.booleans(), NOT_BOOL, **BOOL_EDGES),
        "n": arg(  # n=1024 is valid but slow here (1,024 streams: seconds), so not drawn
            st.integers(1, 3),
            st.integers(max_value=0) | st.integers(min_value=1025) | NOT_INT,
            ok_edges=[1, 3],
            bad_edges=[0, -1, 1025, 2.0, "2", None, True],
        ),
        "seed": arg(
            st.none() | st.integers(0, SEED_MASK),
            st.integers(max_value=-1) | st.integers(min_value=SEED_MASK + 1) | NOT_INT.filter(lambda v: v is not None),
            ok_edges=[None, 0, SEED_MASK],
            bad_edges=[-1, SEED_MASK + 1, 1 << 64, 1.5, "1", True],
        ),
        "logit_bias": arg(
            st.none() | biases(),
            bad_biases(),
            ok_edges=[None, {}, {0: 100}, {VOCAB - 1: -100}, {"7": 0.5}, {i: 1.0 for i in range(VOCAB)}],
            bad_edges=[{"abc": 1}, {" 5": 1}, {"5.0": 1}, {"-1": 1}, {"": 1}, {"٥": 1}, {"9" * 5000: 1},
                       {VOCAB: 1}, {True: 1}, {None: 1}, {"5": 1, 5: 1}, {5: math.nan}, {5: 101},
                       {5: 10**400}, {5: "1"}, {5: [1.0]}, [[5, 1.0]], "5", 5],
        ),
        "logprobs": arg(st.booleans(), NOT_BOOL, **BOOL_EDGES),
        "prompt_logprobs": arg(st.booleans(), NOT_BOOL, **BOOL_EDGES),
        "logprob_start_len": arg(  # 0: any prompt has that position (past it: tests/tok)
            st.just(0),
            st.integers(max_value=-1) | NOT_INT,
            ok_edges=[0],
            bad_edges=[-1, 0.0, None, True, 10**30],
        ),
        "top_logprobs": arg(
            st.integers(0, 20),
            st.integers(max_value=-1) | st.integers(min_value=21) | NOT_INT,
            ok_edges=[0, 20],  # (20: the engine's max_logprobs)
            bad_edges=[-1, 21, 1024, 1025, 1.0, None, True],
        ),
    }  # fmt: skip


def biases() -> st.SearchStrategy[dict[Any, Any]]:
    by_id = st.dictionaries(TOKEN, numbers(-100, 100), max_size=4)
    return by_id | by_id.map(lambda d: {str(k): v for k, v in d.items()})  # JSON's keys


def bad_biases() -> st.SearchStrategy[Any]:
    key = st.sampled_from(["abc", " 5", "5.0", "-1", "", "٥", -1, VOCAB, 1 << 64, True, None])
    value = st.sampled_from([math.nan, math.inf, 101, -100.5, 10**400, "1", None, [1.0], {}])
    return st.one_of(
        st.builds(lambda k, d: {**d, k: 0.0}, key, biases()),
        st.builds(lambda v, d: {**d, 7: v}, value, biases()),
        st.lists(st.tuples(st.integers(0, 9), st.floats(-1, 1)), min_size=1, max_size=2),
        TEXT,
        st.integers(),
    )


def other_args() -> dict[str, Arg]:
    stop_text = st.text(min_size=1, max_size=6)
    bad_stop = st.one_of(
        st.just(""),
        st.integers(),
        st.binary(max_size=3),
        st.dictionaries(stop_text, st.integers(), min_size=1, max_size=1),
        UNICODE_JUNK,
    )
    return {
        "stop": arg(
            st.none() | stop_text | st.lists(stop_text, max_size=4),
            bad_stop | with_one(bad_stop | st.none(), stop_text),
            ok_edges=[None, [], "\x00", "😀", "e\u0301", ["x" * 1024] * 64],
            bad_edges=["", [""], 5, [5], ["\ud800"], "x\udfff", "\ud83d\ude00", "x" * 1025,
                       ["x"] * 65, {"a": 1}, b"x", [None]],
        ),
        "no_stop_trim": arg(st.booleans(), NOT_BOOL, **BOOL_EDGES),
        "skip_special_tokens": arg(st.booleans(), NOT_BOOL, **BOOL_EDGES),
        "spaces_between_special_tokens": arg(st.booleans(), NOT_BOOL, **BOOL_EDGES),
        "allow_auto_truncate": arg(st.booleans(), NOT_BOOL, **BOOL_EDGES),
        "add_special_tokens": arg(  # (None: the prompt's kind decides)
            st.none() | st.booleans(),
            NOT_BOOL.filter(lambda v: v is not None),
            ok_edges=[None, True, False],
            bad_edges=[0, 1, "true", "", 1.0],
        ),
        "truncate_prompt_tokens": arg(  # (at most the context, 512: vLLM refuses more)
            st.none() | st.just(-1) | st.integers(1, 512),
            st.one_of(
                NOT_NUMBER,
                st.floats(),
                st.integers(max_value=0).filter(lambda v: v != -1),
                st.integers(min_value=513),
            ),
            ok_edges=[None, -1, 1, 512],
            bad_edges=[0, -2, I64_MIN, 1.5, "3", True, 513, I64_MAX, 10**30],
        ),
        "priority": arg(
            st.integers(-5, 5) | st.integers(I64_MIN, I64_MAX),
            NOT_INT,
            ok_edges=[I64_MIN, I64_MAX, 0],
            bad_edges=[I64_MAX + 1, I64_MIN - 1, 1.5, "1", None, True],
        ),
        "chat_template_kwargs": arg(  # (set, it is checked against the prompt's kind too)
            st.none(),
            st.one_of(
                NOT_NUMBER.filter(lambda v: v is not None and not isinstance(v, dict)),
                st.sampled_from(["tokenize", "tools", "chat_template", "messages"]).map(
                    lambda k: {k: True}
                ),
                st.sampled_from(["add_generation_prompt", "continue_final_message"]).map(
                    lambda k: {k: "yes"}
                ),
            ),
            ok_edges=[None],
            bad_edges=[
                [], "x", 1, {"x": float("nan")}, {"x": "\ud800"}, {1: True},
                {"add_generation_prompt": True, "continue_final_message": True},
            ],
        ),
        "rid": arg(  # made unique at submission: rids in flight at once stay distinct
            st.none() | st.just("") | st.text(max_size=12),
            st.integers() | st.booleans() | st.binary(max_size=3) | st.lists(TEXT, max_size=1)
            | UNICODE_JUNK,
            ok_edges=[None, "", "a/b", "x" * 1000, "😀"],
            bad_edges=[0, 5, True, False, b"r", ["r"], "r\ud800"],
        ),
    }  # fmt: skip


ARGS = {**sampling_args(), **other_args()}
assert set(ARGS) == SAMPLING_FIELDS | (OTHER_FIELDS - {"input_ids", "messages"})
UNKNOWN = st.from_regex(r"[a-z_]{1,12}", fullmatch=True).filter(
    lambda k: k not in SAMPLING_FIELDS | OTHER_FIELDS
)

# ---- prompts: (positional prompt, keyword options) -----------------------------------------------

ROLES = st.sampled_from(["system", "user", "assistant"])  # what the default chat template allows
CONTENT = st.text(max_size=20)  # 3 of them stay far inside the context (512)
MESSAGE = st.fixed_dictionaries(
    {"role": ROLES, "content": CONTENT}, optional={"name": TEXT, "tool_calls": JSON}
)
USER = {"role": "user", "content": "hi"}
BAD_MESSAGE = st.one_of(
    st.integers(),
    TEXT,
    st.none(),
    st.lists(TEXT, max_size=2),
    st.fixed_dictionaries({"role": ROLES}),
    st.fixed_dictionaries({"content": CONTENT}),
    st.fixed_dictionaries({"role": ROLES, "content": st.integers() | st.none() | st.lists(JSON, max_size=2)}),
    st.fixed_dictionaries({"role": st.integers() | st.none(), "content": CONTENT}),
    st.fixed_dictionaries({"role": ROLES, "content": UNICODE_JUNK}),
    st.fixed_dictionaries({"role": UNICODE_JUNK, "content": CONTENT}),
    st.fixed_dictionaries(  # a role the default chat template refuses (the tokenizer says so)
        {"role": st.text(min_size=1, max_size=8).filter(lambda r: r not in ("system", "user", "assistant")), "content": CONTENT}
    ),
    st.builds(lambda m, v: {**m, "extra": v}, MESSAGE, st.sampled_from([math.nan, math.inf, 1 << 64, {1, 2}, b"x", nested(40)])),
    st.builds(lambda m, k: {**m, k: "x"}, MESSAGE, st.integers() | st.none() | UNICODE_JUNK),
)  # fmt: skip
IDS = st.lists(TOKEN, min_size=1, max_size=20)
LONG_IDS = TOKEN.flatmap(lambda t: st.integers(520, 700).map(lambda n: [t] * n))


def placed(values: st.SearchStrategy[Any], where: Sequence[str | None], verdict: str) -> Any:
    """The prompt passed positionally (None) or by keyword."""
    return st.builds(
        lambda v, k: ((v, {}) if k is None else (None, {k: v}), verdict),
        values,
        st.sampled_from(where),
    )


def prompt_arg() -> Arg:
    ids, chat = [None, "input_ids"], [None, "messages"]
    ok_edges = [
        ("", {}),
        ([0], {}),
        ([VOCAB - 1], {}),
        (None, {"input_ids": [5] * 500}),
        ("\x00", {}),
        ("<|end|><|bos|>", {}),
        ([{"role": "user", "content": ""}], {}),
        ([{**USER, "tool_calls": nested(MAX_JSON_DEPTH - 1)}], {}),
    ]
    long_edges = [(None, {"input_ids": [5] * 509}), ([5] * 100_000, {}), ("God " * 5000, {})]
    bad_edges = [
        ("\ud800", {}),
        ("a\udfff", {}),
        ("\ud83d\ude00", {}),
        ([], {}),
        (None, {"input_ids": []}),
        (None, {"messages": []}),
        ([-1], {}),
        ([VOCAB], {}),
        ([True], {}),
        ([1.0], {}),
        (None, {}),
        ("x", {"input_ids": [1]}),
        (b"x", {}),
        (5, {}),
        (USER, {}),
        ([{"role": "user", "content": 5}], {}),
        ([{"role": "tool", "content": "x"}], {}),
        ([{**USER, "k": nested(MAX_JSON_DEPTH)}], {}),
        ([{**USER, 1: "y"}], {}),
        ([{"role": "user", "content": "\ud800"}], {}),
        (None, {"messages": "hi"}),
        (None, {"input_ids": "hi"}),
        ([USER, 5], {}),
    ]
    return Arg(
        st.one_of(
            placed(st.text(max_size=40), [None], OK),
            placed(IDS, ids, OK),
            placed(st.lists(MESSAGE, min_size=1, max_size=3), chat, OK),
            placed(LONG_IDS, ids, LONG),
        ),
        st.one_of(
            placed(UNICODE_JUNK, [None], BAD),
            placed(st.just([]) | with_one(BAD_ID, TOKEN), ids, BAD),
            placed(st.just([]) | with_one(BAD_MESSAGE, MESSAGE), chat, BAD),
            placed(st.text(max_size=5), ["input_ids", "messages"], BAD),
            placed(st.integers() | st.floats() | st.binary(max_size=3) | st.dictionaries(TEXT, TEXT, max_size=1), [None], BAD),
            st.just(((None, {}), BAD)),  # no prompt at all
            st.builds(lambda t, i: ((t, {"input_ids": i}), BAD), TEXT, IDS),  # two prompts
        ),
        tuple([(e, OK) for e in ok_edges] + [(e, LONG) for e in long_edges] + [(e, BAD) for e in bad_edges]),
    )  # fmt: skip


PROMPT = prompt_arg()
PROMPT_NAMES = ("prompt", "input_ids", "messages")

# ---- requests ------------------------------------------------------------------------------------


@dataclass
class Drawn:
    prompt: Any
    options: dict[str, Any]
    verdicts: dict[str, str] = field(default_factory=dict)
    stream: bool = False

    @property
    def bad(self) -> list[str]:
        empty = self.prompt == "" and self.options.get("add_special_tokens") is False
        if empty and BAD not in self.verdicts.values():  # each fine alone: together no
            return ["prompt"]  # token to start from ("the prompt is empty")
        return [name for name, verdict in self.verdicts.items() if verdict == BAD]


@st.composite
def requests(draw: Callable[..., Any]) -> Drawn:
    """A valid request, one with a single bad argument, or one with anything."""
    mode = draw(st.sampled_from(["valid", "one bad", "mixed"]))
    names = draw(st.lists(st.sampled_from(sorted(ARGS)), unique=True, max_size=10))
    bad = draw(st.sampled_from(["prompt", "unknown", *names])) if mode == "one bad" else None

    def pick(name: str, a: Arg) -> st.SearchStrategy[Tagged]:
        if mode == "mixed":
            return a.any
        return a.bad if name == bad else a.ok

    (prompt, options), verdict = draw(pick("prompt", PROMPT))
    req = Drawn(prompt, dict(options), {"prompt": verdict}, draw(st.booleans()))
    for name in names:
        req.options[name], req.verdicts[name] = draw(pick(name, ARGS[name]))
    if "max_new_tokens" not in names:  # not the default 128: an example stays fast
        req.options["max_new_tokens"] = draw(st.integers(1, 8))
    if bad == "unknown" or (mode == "mixed" and draw(st.integers(0, 9)) == 0):
        name = draw(UNKNOWN)
        req.options[name], req.verdicts[name] = draw(NOT_INT), BAD
    return req


def edge_requests() -> list[Drawn]:
    """Every edge value of every argument, once, beside valid values."""
    reqs = [
        Drawn(prompt, {"max_new_tokens": 4, **options}, {"prompt": verdict})
        for (prompt, options), verdict in PROMPT.edges
    ]
    for name, a in ARGS.items():
        for value, verdict in a.edges:
            reqs.append(
                Drawn(PLAIN, {"max_new_tokens": 4, name: value}, {"prompt": OK, name: verdict})
            )
    for i, req in enumerate(reqs):
        req.stream = i % 2 == 1
    return reqs


# ---- running and judging -------------------------------------------------------------------------


@dataclass
class Outcome:
    finished: dict[int, str | None] | None = None  # per sequence index, its finish reason
    error: BaseException | None = None


_unique = itertools.count()


async def run(engine: rt.Engine, req: Drawn) -> Outcome:
    options = dict(req.options)
    if isinstance(options.get("rid"), str) and options["rid"]:
        options["rid"] += f"#{next(_unique)}"
    try:
        with trio.fail_after(REQUEST_TIMEOUT):
            if req.stream:
                finished: dict[int, str | None] = {}
                async for chunk in engine.stream(req.prompt, **options):
                    finished[chunk.index] = chunk.finish_reason
                return Outcome(finished)
            out = await engine.generate(req.prompt, **options)
            return Outcome({c.index: c.finish_reason for c in out.choices})
    except Exception as err:  # judged by check(); trio.TooSlowError included
        return Outcome(error=err)


async def run_all(engine: rt.Engine, reqs: list[Drawn]) -> list[Outcome]:
    outcomes = [Outcome()] * len(reqs)

    async def one(i: int) -> None:
        outcomes[i] = await run(engine, reqs[i])

    async with trio.open_nursery() as nursery:
        for i in range(len(reqs)):
            nursery.start_soon(one, i)
    return outcomes


def check(req: Drawn, outcome: Outcome) -> None:
    err = outcome.error
    if err is not None and not isinstance(err, InvalidRequestError | ContextOverflowError):
        raise AssertionError(f"{req} raised {type(err).__name__}: {err}") from err
    if req.bad:
        assert isinstance(err, InvalidRequestError), f"{req} was not refused: {outcome}"
        if len(req.bad) == 1:
            names = PROMPT_NAMES if req.bad[0] == "prompt" else (req.bad[0],)
            assert any(n in str(err) for n in names), f"{req}: {err} does not name {names}"
        return
    if err is not None:
        assert isinstance(err, ContextOverflowError) and LONG in req.verdicts.values(), (
            f"{req} was refused: {type(err).__name__}: {err}"
        )
        return
    n = req.options.get("n", 1)
    assert outcome.finished is not None and sorted(outcome.finished) == list(range(n)), outcome
    assert all(reason is not None for reason in outcome.finished.values()), outcome


def incarnations(engine: rt.Engine) -> dict[str, int]:
    return {a.name: a.incarnation for a in engine.actors()}


CONTROL = Drawn(PLAIN, {"max_new_tokens": 4, "temperature": 0.0}, {"prompt": OK})

# ---- the test ------------------------------------------------------------------------------------


def test_no_request_stops_the_engine() -> None:
    trio.run(fuzz)


async def fuzz() -> None:
    async with rt.open_engine(**ENGINE_OPTIONS) as engine:
        first = incarnations(engine)
        for req in edge_requests():  # one at a time: a batch can hide a value (an int
            check(req, await run(engine, req))  # beside floats makes a float tensor)
            assert incarnations(engine) == first, f"an actor restarted during {req}"

        @settings(max_examples=EXAMPLES, deadline=None, derandomize=not EXPLORE, database=None)
        @given(st.lists(requests(), min_size=1, max_size=5))
        def every_request_ends_and_no_actor_restarts(batch: list[Drawn]) -> None:
            before = trio.from_thread.run_sync(incarnations, engine)
            outcomes = trio.from_thread.run(run_all, engine, [*batch, CONTROL])
            after = trio.from_thread.run_sync(incarnations, engine)
            for req, outcome in zip([*batch, CONTROL], outcomes, strict=True):
                note(f"{req} -> {outcome}")
                check(req, outcome)
            assert after == before, f"an actor restarted: {before} -> {after}"

        await trio.to_thread.run_sync(every_request_ends_and_no_actor_restarts)
        assert incarnations(engine) == first
        assert all(a.restart_count == 0 for a in engine.actors()), engine.actors()
        out = await engine.generate(PLAIN, max_new_tokens=8)
        assert out.finish_reason is not None

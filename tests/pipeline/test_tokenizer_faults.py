"""The tokenizer worker's faults, through the whole engine: a request that kills
the worker (poison) or makes the tokenizer raise fails alone, the others of its
batch complete, and neither counts toward the supervisor's escalation.

The worker is ``crashy_actors.CuedTokenizer``, which fails on cues in the text;
each test queues its requests as one batch in a known order while the worker is
held in an earlier batch, so that the count of deaths is exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from crashy_actors import HOLD, POISON, RAISE, CuedTokenizer

import rt
import rt.frontend.wiring
from rt.errors import InvalidRequestError, RequestError, RequestFailedError
from rt.messages import GenerateRequest
from rt.shm import codec

OPTIONS: dict[str, Any] = dict(load_format="null", max_total_tokens=8192, tokenizer_workers=1)
NEW_TOKENS = 4
MAX_CRASHES = 3  # max_crashes_per_request's default


@pytest.fixture(autouse=True)
def cued_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rt.frontend.wiring, "TokenizerActor", CuedTokenizer)


async def until(predicate: Any) -> None:
    with trio.fail_after(10):
        while not predicate():
            await trio.sleep(0.005)


async def one_batch(
    engine: rt.Engine, prompts: dict[str, str], hold: Path, raw: tuple[GenerateRequest, ...] = ()
) -> dict[str, Any]:
    """Submit ``prompts`` in this order while the worker is held, so they reach it as
    one batch (``raw`` first, sent as frames past the frontend's checks). Each
    name's output, or the error it got."""
    results: dict[str, Any] = {}

    async def run(name: str, prompt: str) -> None:
        try:
            results[name] = await engine.generate(
                prompt, max_new_tokens=NEW_TOKENS, ignore_eos=True
            )
        except RequestError as err:
            results[name] = err

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "held", f"{HOLD}{hold}")
        await until((hold / "entered").exists)
        for req in raw:
            await engine._to_tok[0].send(codec.dumps(req))
        for name, prompt in prompts.items():
            nursery.start_soon(run, name, prompt)
            await trio.testing.wait_all_tasks_blocked()  # its frame is in the ring
        (hold / "go").touch()
    return results


def restarts(engine: rt.Engine) -> int:
    return next(a for a in engine.actors() if a.name == "tokenizer0").restart_count


def assert_completed(outputs: list[Any]) -> None:
    assert all(getattr(o, "meta", None) is not None for o in outputs), outputs
    assert all(o.meta.completion_tokens == NEW_TOKENS for o in outputs)


@pytest.mark.slow
@pytest.mark.parametrize("position", [0, 3, 6], ids=["first", "middle", "last"])
async def test_a_poison_in_a_batch_fails_alone_wherever_it_sits(
    tiny_model: Path, tmp_path: Path, position: int
) -> None:
    # The worker dies tokenizing (its "tokenize" fault point) with the whole batch
    # in hand. Its successor retries that batch one request at a time; the poison is
    # refused once MAX_CRASHES workers died with it in hand: the batch's, then two alone.
    prompts = {f"ok{i}": f"prompt {i}" for i in range(6)}
    names = list(prompts)
    names.insert(position, "poison")
    prompts["poison"] = f"a {POISON} prompt"
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        results = await one_batch(engine, {n: prompts[n] for n in names}, tmp_path)
        poison = results.pop("poison")
        assert isinstance(poison, RequestFailedError), poison
        assert "tokenizer workers died" in str(poison)
        assert_completed(list(results.values()))
        assert restarts(engine) == MAX_CRASHES


@pytest.mark.slow
async def test_a_poison_flood_never_escalates(tiny_model: Path, tmp_path: Path) -> None:
    # Four poisons in one batch, with room for two restarts: every death happened
    # with requests in hand, so none counts toward escalation. With two crashes
    # per request: one death for the batch, then one alone for each poison.
    prompts: dict[str, str] = {}
    for i in range(4):
        prompts[f"ok{i}"] = f"prompt {i}"
        prompts[f"poison{i}"] = f"{POISON} number {i}"
    prompts["ok4"] = "prompt 4"
    options = dict(OPTIONS, max_restarts=2, max_crashes_per_request=2)
    async with rt.open_engine(str(tiny_model), **options) as engine:
        results = await one_batch(engine, prompts, tmp_path)
        for i in range(4):
            assert isinstance(results.pop(f"poison{i}"), RequestFailedError)
        assert_completed(list(results.values()))
        assert restarts(engine) == 1 + 4 * (2 - 1)


async def test_a_text_the_tokenizer_raises_on_is_refused_alone(
    tiny_model: Path, tmp_path: Path
) -> None:
    # RAISE makes the batched tokenizer call raise; so does a lone surrogate in the
    # real tokenizer (sent as a raw frame: the frontend may refuse it before that).
    # Each is refused alone, the batch's others complete, and the worker lives on.
    surrogate = GenerateRequest("lone-surrogate", text="a \ud800 b")
    prompts = {"ok0": "prompt 0", "raise": f"{RAISE} this", "ok1": "prompt 1"}
    async with rt.open_engine(str(tiny_model), **OPTIONS) as engine:
        results = await one_batch(engine, prompts, tmp_path, raw=(surrogate,))
        refused = results.pop("raise")
        assert isinstance(refused, InvalidRequestError), refused
        assert "could not encode" in str(refused)
        assert_completed(list(results.values()))
        assert restarts(engine) == 0

"""A death just after a commit (fault point ``commit``): what the actor released
is what it had handled, so its successor and the frontend's table carry every
request on, with the output an uninterrupted run gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import rt
from rt.errors import SegmentError
from rt.gpu import EngineConfig, EngineCore, SamplingParams
from rt.pipeline.mail import unreadable_side
from rt.tok.load import load_tokenizer

PROMPTS = ["In the beginning", "And God said", "Let there be light", "The quick brown fox"]
GREEDY: dict[str, Any] = dict(max_new_tokens=12, ignore_eos=True, temperature=0.0)
OPTIONS: dict[str, Any] = dict(device="cpu", max_total_tokens=8192)  # as the reference


async def outputs(engine: rt.Engine) -> list[tuple[int, ...]]:
    results: list[tuple[int, ...]] = [()] * len(PROMPTS)

    async def one(i: int) -> None:
        results[i] = (await engine.generate(PROMPTS[i], **GREEDY)).output_ids

    async with trio.open_nursery() as nursery:
        for i in range(len(PROMPTS)):
            nursery.start_soon(one, i)
    return results


@pytest.fixture(scope="module")
def reference(tiny_model) -> list[tuple[int, ...]]:
    """The engine core alone, in this process: what an uninterrupted run gives."""
    tokenizer = load_tokenizer(str(tiny_model))
    core = EngineCore(EngineConfig(model_path=tiny_model, **OPTIONS))
    for i, text in enumerate(PROMPTS):
        core.add_request(str(i), tokenizer(text)["input_ids"], SamplingParams(**GREEDY))
    out: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    while core.has_work:
        for o in core.step().outputs:
            out[o.rid] += o.token_ids
    return [tuple(out[str(i)]) for i in range(len(PROMPTS))]


# the tokenizer and the scheduler commit once per batch they take in (a couple here);
# the detokenizer once per step
@pytest.mark.parametrize(
    ("name", "hit"), [("tokenizer0", 1), ("scheduler", 1), ("detokenizer", 1), ("detokenizer", 5)]
)
async def test_a_death_just_after_a_commit_loses_nothing(
    tiny_model, tmp_path: Path, reference: list[tuple[int, ...]], name: str, hit: int
) -> None:
    rule = {"actor": name, "point": "commit", "action": "sigkill", "after": hit - 1}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"seed": 1, "faults": [{**rule, "incarnation": 1}]}))
    async with rt.open_engine(str(tiny_model), fault_plan=str(path), **OPTIONS) as engine:
        with trio.fail_after(120):
            got = await outputs(engine)
        (status,) = [a for a in engine.actors() if a.name == name]
        assert status.restart_count == 1  # the fault fired, once
    assert got == reference


async def test_an_unreadable_side_frame_is_said_once_in_100_tries(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # An actor out of fds cannot open a side frame's segment until some close: it
    # logged an ERROR every 20 ms for as long as that lasted.
    tries = 0
    start = trio.current_time()
    for _ in range(200):
        tries = await unreadable_side("tok0", SegmentError("out of file descriptors"), tries)
    said = [r for r in caplog.records if "a side frame cannot be read" in r.getMessage()]
    assert tries == 200 and len(said) == 2
    assert trio.current_time() - start > 90  # waits grow to 0.5 s: not a busy retry

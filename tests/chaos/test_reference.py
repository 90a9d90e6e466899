"""The bfloat16 splice check on the shipped model: honest outputs (batched, resumed
in another batch, greedy and seeded) stay within the tolerance token by token; a
splice of two runs that had diverged does not."""

from __future__ import annotations

from typing import Any

import pytest

from rt.assets import default_model_path
from rt.chaos.checks import SPLICE_TOLERANCE
from rt.chaos.reference import Job, Replayer

NEW = 40
PROMPTS = [[(11 * i + 7 * j) % 3000 + 3 for j in range(5 + 3 * i)] for i in range(8)]


def options(i: int) -> dict[str, Any]:
    if i % 2 == 0:
        return {"max_new_tokens": NEW, "ignore_eos": True, "temperature": 0.0}
    return {"max_new_tokens": NEW, "ignore_eos": True, "temperature": 1.0, "top_p": 0.95,
            "seed": 500 + i}  # fmt: skip


def run(reqs: list[tuple[int, list[int], int]]) -> dict[int, list[int]]:
    """Run requests (index, prior tokens, max_new_tokens counting the prior ones) in one
    batch of a fresh core."""
    from rt.gpu import EngineConfig, EngineCore, SamplingParams

    core = EngineCore(
        EngineConfig(
            model_path=str(default_model_path()), dtype="bfloat16", max_total_tokens=1 << 14
        )
    )
    for i, prior, new in reqs:
        params = SamplingParams(**{**options(i), "max_new_tokens": new})
        core.add_request(str(i), PROMPTS[i], params, output_ids=[prior] if prior else ())
    out = {i: list(prior) for i, prior, _ in reqs}
    while core.has_work:
        for o in core.step().outputs:
            out[int(o.rid)] += o.token_ids
    return out


@pytest.fixture(scope="module")
def replayer() -> Replayer:
    return Replayer(str(default_model_path()), "bfloat16")


def job(i: int) -> Job:
    return Job(str(i), PROMPTS[i], options(i))


@pytest.mark.slow
def test_honest_bfloat16_outputs_are_within_the_tolerance(replayer: Replayer) -> None:
    batched = run([(i, [], NEW) for i in range(8)])
    # resumed after 15 tokens by a successor that holds another batch (half of them)
    resumed = run([(i, batched[i][:15], NEW) for i in range(1, 8, 2)])
    for i, ids in [*batched.items(), *((i, ids) for i, ids in resumed.items())]:
        margins = replayer.margins(job(i), ids)
        assert len(margins) == NEW and max(margins) <= SPLICE_TOLERANCE, (i, max(margins))


@pytest.mark.slow
@pytest.mark.parametrize("i", [0, 1, 2, 5])
def test_a_splice_of_two_diverged_runs_is_over_the_tolerance(replayer: Replayer, i: int) -> None:
    """The dead run's tokens up to 20, then its successor's, which had resumed
    from a prefix that differs at token 10: what a splice shows once re-computed
    tokens differ from the dead run's. (Seeded draws share their noise, so a
    seeded successor may fall back in step: request 3's did, 19 of its 20 tokens
    after the splice the dead run's, the other at a near-tie. That output is one
    run's, to within rounding, and passes.)"""
    dead = run([(i, [], NEW)])[i]
    other = [*dead[:10], (dead[10] + 1) % 3000 + 3]
    successor = run([(i, other, NEW)])[i]
    assert successor[11:20] != dead[11:20]  # the runs diverged
    spliced = dead[:20] + successor[20:]
    margins = replayer.margins(job(i), spliced)
    over = [j for j, m in enumerate(margins) if m > SPLICE_TOLERANCE]
    assert over and over[0] >= 20, (i, over)
    assert max(replayer.margins(job(i), dead)) <= SPLICE_TOLERANCE


@pytest.mark.parametrize(
    "options",
    [{"temperature": 1.0, "top_p": 0.9}, {"temperature": 0.0, "repetition_penalty": 1.2}],
)
def test_a_draw_it_does_not_model_is_refused_not_scored(
    replayer: Replayer, options: dict[str, Any]
) -> None:
    """An unseeded draw, or one with penalties: a margin would be a false finding."""
    with pytest.raises(ValueError, match="cannot score"):
        replayer.margins(Job("x", [5, 6, 7], options), [8, 9])


def test_a_float32_output_that_took_the_other_side_of_an_exact_tie_passes() -> None:
    """Found by rt-chaos (seed 34): in float32 this greedy request draws ' earth'
    at token 6 alone and ' wicked' beside a request that shares its first two
    tokens (the best two logits there are ~5e-7 apart). The output is still its
    run's own, token for token, to within FLOAT32_TIE; the reference check
    accepts it, and a token changed after it stays a finding."""
    from rt.chaos.ledger import Ledger
    from rt.chaos.schedule import Schedule
    from rt.chaos.verdict import FLOAT32_TIE, Judge

    f32 = Replayer(str(default_model_path()), "float32")
    greedy = {"max_new_tokens": 10, "ignore_eos": True, "temperature": 0.0}
    jobs = [Job(str(i), f32.encode(p), greedy) for i, p in enumerate(TIED)]
    batched = f32.reference(jobs)["1"]
    alone = f32.reference(jobs[1:])["1"]  # the Judge's reference for it: a batch of one
    assert max(f32.margins(jobs[1], batched)) <= FLOAT32_TIE
    assert max(f32.margins(jobs[1], alone)) <= FLOAT32_TIE

    def verdict(ids: list[int]) -> list[str]:
        spec = {"index": 0, "prompt": TIED[1], "max_new_tokens": 10, "temperature": 0.0,
                "top_p": 1.0, "seed": None, "hostile": None}  # fmt: skip
        end = {"ev": "end", "t": 2.0, "req": 0, "state": "completed", "ids": ids,
               "text": f32.decode(ids)}  # fmt: skip
        ledger = Ledger.of([{"ev": "invoke", "t": 1.0, "req": 0, "spec": spec}, end])
        return [f.checker for f in Judge(f32).judge(ledger, Schedule(1)).findings]

    assert verdict(alone) == [] and verdict(batched) == []  # either side of the tie
    broken = [*batched[:8], (batched[8] + 1) % 3000 + 3, batched[9]]
    assert verdict(broken) == ["reference"]


TIED = ["God void light moved was form", "God the light face divided"]

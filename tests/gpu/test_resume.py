"""A request resubmitted with the tokens it already has continues exactly (float32).

After a scheduler restart the frontend resubmits each live request with its
original sampling parameters, each child's tokens so far and the children
already finished; the core must go on as if nothing happened.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

import pytest
from gpu_testlib import greedy, make_engine, prompts

from rt.gpu import EngineConfig, EngineCore, SamplingParams
from rt.gpu.request import ReqOutput

NEW = 12


def collect(
    engine: EngineCore,
    priors: Sequence[Sequence[int]] = (),
) -> tuple[dict[int, list[int]], dict[int, ReqOutput]]:
    """Step until idle; each child's whole output (priors first) and its final output.
    Asserts that every step's token_offset continues its child's output."""
    seqs: dict[int, list[int]] = {}
    finals: dict[int, ReqOutput] = {}
    while engine.has_work:
        for o in engine.step().outputs:
            seq = seqs.setdefault(o.index, list(priors[o.index]) if priors else [])
            assert o.token_offset == len(seq), (o.index, o.token_offset, len(seq))
            seq.extend(o.token_ids)
            if o.finish_reason is not None:
                finals[o.index] = o
        engine.check_integrity()
    return seqs, finals


def resumed(
    path: Path,
    prompt: list[int],
    params: SamplingParams,
    priors: Sequence[Sequence[int]],
    finished: Collection[int] = (),
) -> tuple[dict[int, list[int]], dict[int, ReqOutput]]:
    # other pages and chunks than the uninterrupted run: the prior tokens are prefilled in pieces
    engine = make_engine(path, chunked_prefill_size=4, page_size=16)
    engine.add_request("x", prompt, params, output_ids=priors, finished=finished)
    return collect(engine, priors)


SEEDED = dict(temperature=0.8, seed=4321, frequency_penalty=0.4, repetition_penalty=1.1)


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
@pytest.mark.parametrize("cut", [1, 5])
def test_one_sequence_resumes_exactly(
    checkpoints: dict[str, Path], sampling: str, cut: int
) -> None:
    path = checkpoints["llama"]
    prompt = prompts(1, [23], seed=3)[0]
    kwargs = SEEDED if sampling == "seeded" else dict(temperature=0.0)
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True, **kwargs)  # type: ignore[arg-type]
    full, _ = collect(_started(path, prompt, params))
    assert len(full[0]) == NEW
    seqs, finals = resumed(path, prompt, params, [full[0][:cut]])
    assert seqs == full  # the prior tokens were not reported again (collect checks offsets)
    # the prior tokens counted against the original budget
    assert finals[0].finish_reason == "length" and finals[0].completion_tokens == NEW


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_n_children_resume_each_from_its_own_tokens(
    checkpoints: dict[str, Path], sampling: str
) -> None:
    path = checkpoints["llama"]
    prompt = prompts(1, [19], seed=4)[0]
    kwargs = SEEDED if sampling == "seeded" else dict(temperature=0.0)
    params = SamplingParams(max_new_tokens=NEW, n=3, ignore_eos=True, **kwargs)  # type: ignore[arg-type]
    full, _ = collect(_started(path, prompt, params))
    assert all(len(full[i]) == NEW for i in range(3))
    if sampling == "seeded":
        assert len({tuple(s) for s in full.values()}) == 3  # each child its own draws
    # child 1 had finished when the scheduler died; 0 and 2 were cut at different points
    priors = [full[0][:3], full[1], full[2][:8]]
    seqs, finals = resumed(path, prompt, params, priors, finished=(1,))
    assert 1 not in seqs and 1 not in finals  # not run again, nothing reported
    assert seqs == {0: full[0], 2: full[2]}
    assert {i: o.finish_reason for i, o in finals.items()} == {0: "length", 2: "length"}


def test_prior_tokens_count_toward_min_new_tokens(checkpoints: dict[str, Path]) -> None:
    """The null model emits a fixed token per position, so a stop id lands where we choose."""
    path = checkpoints["llama"]
    prompt = prompts(1, [10], seed=5)[0]
    free, _ = collect(_started(path, prompt, greedy(NEW, ignore_eos=True), load_format="null"))
    stop = free[0][5]
    assert stop not in free[0][:5]
    # the stop id may end the request from the 4th token on: it does at index 5
    params = greedy(NEW, ignore_eos=True, stop_token_ids=(stop,), min_new_tokens=4)
    engine = make_engine(path, load_format="null")
    engine.add_request("x", prompt, params, output_ids=[free[0][:5]])
    seqs, finals = collect(engine, [free[0][:5]])
    assert seqs[0] == free[0][:6]
    assert finals[0].finish_reason == "stop" and finals[0].completion_tokens == 6


def test_all_children_finished_queues_nothing(checkpoints: dict[str, Path]) -> None:
    engine = EngineCore(
        EngineConfig(model_path=checkpoints["llama"], load_format="null", max_total_tokens=512)
    )
    engine.add_request("x", [5, 6], greedy(4, n=2), output_ids=[[7], [8]], finished=(0, 1))
    assert not engine.has_work and "x" not in engine.reqs


def _started(path: Path, prompt: list[int], params: SamplingParams, **kw: object) -> EngineCore:
    engine = make_engine(path, **kw)
    engine.add_request("x", prompt, params)
    return engine

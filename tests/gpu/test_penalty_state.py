"""Penalty state is made once per sequence and extended by each step's new tokens: the
same logits, tokens and logprobs as a per-step rebuild from the ids, as rows join, leave
and move, for resumed and retracted sequences, and nothing kept once requests finish."""

from __future__ import annotations

import gc
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_testlib import VOCAB, make_engine, prompts, run_all

from rt.gpu import sampler
from rt.gpu.sampler import SampleRow, sample
from rt.gpu.sampling_params import SamplingParams


def _padded(seqs: Sequence[Sequence[int]], pad: int, device: torch.device) -> torch.Tensor:
    width = max(1, max(len(s) for s in seqs))
    out = torch.full((len(seqs), width), pad, dtype=torch.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.int64)
    return out.to(device)


def rebuilt_penalties(logits: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
    """The reference: the penalties as the sampler applied them before, rebuilt from
    every row's ids at every step."""
    bs, vocab = logits.shape
    device = logits.device
    freq = torch.tensor([float(r.params.frequency_penalty) for r in rows], device=device)
    pres = torch.tensor([float(r.params.presence_penalty) for r in rows], device=device)
    rep = torch.tensor([float(r.params.repetition_penalty) for r in rows], device=device)
    # pad id `vocab` lands in an extra column that is dropped
    out_ids = _padded([r.output_ids for r in rows], vocab, device)
    counts = torch.zeros(bs, vocab + 1, device=device).scatter_add_(
        1, out_ids, torch.ones_like(out_ids, dtype=torch.float32)
    )[:, :vocab]
    logits = logits - freq[:, None] * counts - pres[:, None] * (counts > 0).float()
    if bool((rep != 1.0).any()):
        all_ids = _padded([[*r.input_ids, *r.output_ids] for r in rows], vocab, device)
        seen = torch.zeros(bs, vocab + 1, dtype=torch.bool, device=device).scatter_(
            1, all_ids, True
        )[:, :vocab]
        penalised = torch.where(logits > 0, logits / rep[:, None], logits * rep[:, None])
        logits = torch.where(seen, penalised, logits)
    return logits


class Seq:
    """A sequence as the engine keeps one: a prompt, outputs that grow, one owner object."""

    def __init__(self, params: SamplingParams, prompt: list[int], seed: int) -> None:
        self.params, self.input_ids, self.seed = params, list(prompt), seed
        self.output_ids: list[int] = []

    def row(self, owned: bool = True) -> SampleRow:
        position = len(self.input_ids) + len(self.output_ids)
        return SampleRow(self.params, self.seed, position, self.input_ids, self.output_ids, [],
                         self if owned else None)  # fmt: skip


def test_draws_match_the_rebuild_as_rows_join_leave_and_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vocab = 300
    rng = random.Random(5)
    g = torch.Generator().manual_seed(7)
    kinds: list[dict[str, Any]] = [
        dict(frequency_penalty=0.5),
        dict(presence_penalty=-0.7),
        dict(repetition_penalty=1.3),
        dict(repetition_penalty=0.8, frequency_penalty=-0.4),
        dict(repetition_penalty=1.2, presence_penalty=0.3),
        dict(frequency_penalty=1.5, presence_penalty=0.9),
        dict(repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=-1.0),
        dict(),  # no penalty, in a batch with some
    ]
    seqs: list[Seq] = []
    for i, kind in enumerate(kinds):
        params = SamplingParams(temperature=[0.0, 0.8][i % 2], top_k=40, logprobs=True, **kind)
        prompt = [rng.randrange(vocab) for _ in range(rng.choice([1, 7, 60]))]
        seqs.append(Seq(params, prompt, seed=i))
    siblings = [Seq(seqs[6].params, seqs[6].input_ids, seed=100 + i) for i in range(2)]
    seqs += siblings  # n > 1: one params object, a prompt each
    for step in range(40):
        if step == 12:  # a resubmission: a new owner, with the outputs so far
            resumed = Seq(seqs[2].params, seqs[2].input_ids, seed=2)
            resumed.output_ids = list(seqs[2].output_ids)
            seqs[2] = resumed
        if step == 20:  # outputs that did not only grow (not in rt): the state is made again
            out = seqs[3].output_ids  # the last two changed, the last counted among them
            out[-2:] = [(t + 1) % vocab for t in out[-2:]]
            del seqs[4].output_ids[-3:]
        batch = rng.sample(seqs, rng.randrange(1, len(seqs) + 1))  # join, leave, move
        rows = [s.row(owned=s is not seqs[5]) for s in batch]  # seqs[5]: made per call
        logits = torch.randn(len(rows), vocab, generator=g) * 4
        assert torch.equal(
            sampler._apply_penalties(logits, rows), rebuilt_penalties(logits, rows)
        ), step
        got = sample(logits, rows)
        with monkeypatch.context() as m:
            m.setattr(sampler, "_apply_penalties", rebuilt_penalties)
            assert sample(logits, rows) == got, step
        for s, tok in zip(batch, got.token_ids, strict=True):
            # half the time a prompt id instead: ids of the prompt among the outputs, counts > 1
            s.output_ids.append(tok if rng.random() < 0.5 else rng.choice(s.input_ids))


def test_engine_outputs_match_the_rebuild(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = checkpoints["llama"]
    p0, p1, p2, p3 = prompts(4, [30, 9, 14, 22], seed=31)
    common = dict(ignore_eos=True, logprobs=True, top_logprobs=2)

    def run(**engine: Any) -> tuple[dict[str, Any], int]:
        core = make_engine(path, **engine)
        reqs = {
            "all": (p0, SamplingParams(n=3, seed=4, max_new_tokens=16, frequency_penalty=0.6,
                                       presence_penalty=0.4, repetition_penalty=1.3, **common)),
            "rep": (p1, SamplingParams(temperature=0.0, max_new_tokens=12,
                                       repetition_penalty=1.5, **common)),
            "freq": (p2, SamplingParams(seed=6, max_new_tokens=14, frequency_penalty=-0.5,
                                        **common)),
            "plain": (p3, SamplingParams(seed=7, max_new_tokens=10, **common)),
        }  # fmt: skip
        # resubmitted with the tokens it had: its state is made from prompt + outputs
        resume = SamplingParams(seed=8, max_new_tokens=12, repetition_penalty=0.7,
                                presence_penalty=1.0, **common)  # fmt: skip
        core.add_request("resumed", p1, resume, output_ids=[[p1[0], 5, p1[0], 9]])
        return run_all(core, reqs), core.num_retractions

    def outputs(res: dict[str, Any]) -> dict[str, Any]:
        return {k: (r["tokens"], r["logprobs"], r["top"]) for k, r in res.items()}

    kept_penalties = sampler._apply_penalties
    checked = 0

    def checking(logits: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
        """The kept state's logits, asserted equal to the rebuild's at every step."""
        nonlocal checked
        got = kept_penalties(logits, rows)
        assert torch.equal(got, rebuilt_penalties(logits, rows))
        checked += 1
        return got

    setups: list[dict[str, Any]] = [
        dict(max_running_requests=3),  # rows join the batch as others leave
        dict(max_total_tokens=64, page_size=1),  # a pool too small: retractions
        dict(overlap_schedule=True, max_running_requests=4),
    ]
    for setup in setups:
        with monkeypatch.context() as m:
            m.setattr(sampler, "_apply_penalties", checking)
            kept, retractions = run(**setup)
        with monkeypatch.context() as m:
            m.setattr(sampler, "_apply_penalties", rebuilt_penalties)
            rebuilt, _ = run(**setup)
        assert outputs(kept) == outputs(rebuilt), setup
        assert set(kept) == {"all", "all#1", "all#2", "rep", "freq", "plain", "resumed"}
        assert len(kept["resumed"]["tokens"]) == 12 - 4
        if "max_total_tokens" in setup:
            assert retractions > 0
    assert checked > 3 * 16


def test_no_state_is_kept_once_requests_finish(checkpoints: dict[str, Path]) -> None:
    gc.collect()
    states, pools = len(sampler._STATES), len(sampler._POOLS)
    engine = make_engine(checkpoints["qwen2"], max_running_requests=2)
    for i, prompt in enumerate(prompts(8, [40] * 8, seed=9)):
        params = SamplingParams(seed=i, max_new_tokens=3 + i, repetition_penalty=1.2, n=1 + i % 2)
        engine.add_request(f"r{i}", prompt, params)
    most = 0
    while engine.has_work:
        engine.step()
        assert len(sampler._POOLS) <= pools + 1
        pool = sampler._POOLS.get((engine.device, VOCAB))
        if pool is not None:
            most = max(most, pool.counts.shape[0])
        del pool
        assert len(sampler._STATES) - states <= 2 + 1  # running, and one not collected yet
    # the pool's rows are reused: it grows with the sequences running at once, not with all
    assert 0 < most <= 8
    gc.collect()
    assert (len(sampler._STATES), len(sampler._POOLS)) == (states, pools)
    # nor does a request whose params only the engine held
    target = prompts(1, [7], seed=8)[0]
    res = run_all(
        engine, {"again": (target, SamplingParams(max_new_tokens=3, frequency_penalty=1))}
    )
    assert len(res["again"]["tokens"]) == 3
    gc.collect()
    assert (len(sampler._STATES), len(sampler._POOLS)) == (states, pools)

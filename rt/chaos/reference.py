"""What an uninterrupted run produces: rt's engine core alone, in this process.

* :meth:`Replayer.reference` runs requests from their prompts to the end. In
  float32 the core is batch-invariant (a request's tokens do not depend on
  its batch: measured, 24 of 24), so one batched run gives every request's
  uninterrupted output, which a faulted run must equal byte for byte.
* :meth:`Replayer.margins` (bfloat16) scores an output token by token: one
  forward pass over the prompt and the output (teacher forcing) gives, at
  each position, the logits a run conditioned on exactly the tokens before
  it computes, and each token's margin is how far the sampler's own draw
  (greedy, or seeded Gumbel-max: the same noise, a pure function of seed and
  position) puts it behind its best rival, in logits. In bfloat16 neither
  batch composition nor a re-prefill leaves the logits bit for bit the same,
  so an honest output may trail by a rounding error at a near-tie (measured
  up to 0.03 on the default model, batched 32 ways); a token drawn by a run
  that saw another prefix, a splice of two runs that had diverged, trails by
  whole logits where their contexts differ (:func:`rt.chaos.checks.no_splicing`).
  Replaying each request alone from a resumption point instead (the check
  before this one) refused honest outputs: a batched run's tokens at a near-tie
  are not what a lone decode draws.

Replays never share a prefix cache entry: a cache hit changes the shapes
of the prefill and so, in bfloat16, its numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SAMPLING_FIELDS = ("max_new_tokens", "ignore_eos", "temperature", "top_p", "top_k", "seed")
# A rival inside top_p − this, not top_p, counts against a sampled token: a token at
# the nucleus' edge may be in for one run's rounding and out for the replay's.
TOP_P_SLACK = 0.02


@dataclass(frozen=True)
class Job:
    key: str
    prompt_ids: list[int]
    options: dict[str, Any]  # the request's sampling options (engine keyword form)


class Replayer:
    def __init__(
        self,
        model_path: str,
        dtype: str = "float32",
        max_total_tokens: int = 1 << 15,
        load_format: str = "auto",
    ) -> None:
        self.model_path, self.dtype, self.max_total_tokens = model_path, dtype, max_total_tokens
        self.load_format = load_format
        self._core: Any = None
        self._tokenizer: Any = None
        self._serial = 0
        self.replays = 0  # runs of the core so far (one per reference batch or continuation)

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from rt.tok.load import load_tokenizer

            self._tokenizer = load_tokenizer(self.model_path)
        return self._tokenizer

    @property
    def core(self) -> Any:
        if self._core is None:
            from rt.gpu import EngineConfig

            self._core = _scoring_core_class()(
                EngineConfig(
                    model_path=self.model_path,
                    dtype=self.dtype,
                    load_format=self.load_format,
                    max_total_tokens=self.max_total_tokens,
                    enable_prefix_cache=False,
                )
            )
        return self._core

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def _add(self, job: Job, params: Any = None, tokens: Sequence[int] | None = None) -> str:
        """Add ``job`` to the core under a fresh rid: its prompt (or ``tokens``) with its
        own sampling (or ``params``)."""
        self._serial += 1
        rid = f"{job.key}#{self._serial}"
        tokens = job.prompt_ids if tokens is None else tokens
        self.core.add_request(rid, tokens, params or _sampling(job))
        return rid

    def reference(self, jobs: Sequence[Job]) -> dict[str, list[int]]:
        """Every job run from its prompt to the end, in one batch."""
        self.replays += 1
        rids = {self._add(job): job.key for job in jobs}
        out: dict[str, list[int]] = {key: [] for key in rids.values()}
        while self.core.has_work:
            for o in self.core.step().outputs:
                out[rids[o.rid]] += o.token_ids
        return out

    def margins(self, job: Job, ids: Sequence[int]) -> list[float]:
        """How far, in logits, each token of ``ids`` trails the one a run conditioned
        on the prompt and ``ids`` before it draws (0 where it is that one)."""
        import dataclasses

        import torch

        from rt.gpu import SamplingParams
        from rt.gpu.sampler import _filter, seeded_uniform

        sampling = _sampling(job)
        unmodelled = sorted(set(job.options) - set(SAMPLING_FIELDS))
        if unmodelled or (not sampling.greedy and sampling.seed is None):
            # penalties, logit_bias, min_p, n > 1, an unseeded draw: not what is scored here
            raise ValueError(f"margins cannot score a draw with {unmodelled or 'no seed'}")
        if not ids:
            return []
        self.replays += 1
        prompt = list(job.prompt_ids)
        params = SamplingParams(max_new_tokens=1, ignore_eos=True, prompt_logprobs=True)
        rid = self._add(job, params, prompt + list(ids))
        while self.core.has_work:
            self.core.step()
        # row j: the logits at the position before output token j
        logits = torch.cat(self.core.prompt_logits.pop(rid))[len(prompt) - 1 :]
        target = torch.tensor(list(ids))[:, None]
        if sampling.greedy:
            best = logits.max(dim=-1).values
            return (best - logits.gather(1, target)[:, 0]).tolist()
        seed, temperature = sampling.seed or 0, sampling.temperature
        if sampling.top_p < 1.0:
            sampling = dataclasses.replace(sampling, top_p=max(sampling.top_p - TOP_P_SLACK, 0.0))
        n, vocab = logits.shape
        scaled = logits / temperature
        noise = -torch.log(
            -torch.log(
                seeded_uniform(
                    torch.full((n,), seed),
                    torch.arange(len(prompt), len(prompt) + n),
                    vocab,
                )
            )
        )
        rivals = (_filter(scaled, [sampling] * n, vocab) + noise).max(dim=-1).values
        chosen = (scaled + noise).gather(1, target)[:, 0]
        return ((rivals - chosen).clamp(min=0.0) * temperature).tolist()


def _sampling(job: Job) -> Any:
    from rt.gpu import SamplingParams

    return SamplingParams(**{k: v for k, v in job.options.items() if k in SAMPLING_FIELDS})


def _scoring_core_class() -> type:
    """rt's engine core, keeping the logits of the prompt positions it was asked to
    score (``prompt_logits[rid]``, a list of chunks) besides their logprobs."""
    from rt.gpu import EngineCore

    class ScoringCore(EngineCore):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.prompt_logits: dict[str, list[Any]] = {}

        def _prompt_logprobs(self, items: Any, batch: Any, logits: Any) -> None:
            for b, row, count, _ in batch.prompt_spans:
                chunk = logits[row : row + count].float().cpu()
                self.prompt_logits.setdefault(items[b].req.rid, []).append(chunk)
            super()._prompt_logprobs(items, batch, logits)

    return ScoringCore

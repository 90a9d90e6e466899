"""What an uninterrupted run produces: rt's engine core alone, in this process.

* :meth:`Replayer.reference` runs requests from their prompts to the end. In
  float32 the core is batch-invariant (a request's tokens do not depend on
  its batch: measured, 24 of 24), so one batched run gives every request's
  uninterrupted output, which a faulted run must equal byte for byte.
* :meth:`Replayer.continues` runs one request alone from a prefix (the
  tokens a restarted scheduler took over) and says whether it produces
  the given continuation; it stops at the first token that differs. In
  bfloat16 the core is not batch-invariant (16 of 24) and a re-prefill
  computes other logits than the decode it replaces, so there the check is
  that each output is a chain of single runs, each conditioned on the
  prefix before it (:func:`rt.chaos.checks.one_run`).

Replays never share a prefix cache entry: a cache hit changes the shapes
of the prefill and so, in bfloat16, its numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SAMPLING_FIELDS = ("max_new_tokens", "ignore_eos", "temperature", "top_p", "top_k", "seed")


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
            from rt.gpu import EngineConfig, EngineCore

            self._core = EngineCore(
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

    def _add(self, job: Job, prefix: Sequence[int] = ()) -> str:
        from rt.gpu import SamplingParams

        self._serial += 1
        rid = f"{job.key}#{self._serial}"
        params = SamplingParams(**{k: v for k, v in job.options.items() if k in SAMPLING_FIELDS})
        extra = {"output_ids": [list(prefix)]} if prefix else {}
        self.core.add_request(rid, job.prompt_ids, params, **extra)
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

    def continues(self, job: Job, prefix: Sequence[int], expected: Sequence[int]) -> bool:
        """Whether ``job`` run alone from ``prefix`` produces ``expected`` next, and
        (when ``expected`` is all that is left of the budget) nothing more."""
        self.replays += 1
        rid = self._add(job, prefix)
        got: list[int] = []
        while self.core.has_work:
            for o in self.core.step().outputs:
                got += o.token_ids
            if got[: len(expected)] != list(expected[: len(got)]):
                self.core.abort(rid)
                while self.core.has_work:
                    self.core.step()
                return False
            if len(got) >= len(expected):
                self.core.abort(rid)
                while self.core.has_work:
                    self.core.step()
                return True
        return got == list(expected)

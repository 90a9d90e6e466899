"""A request's state inside the engine core, and what a step reports about it."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rt.errors import InvalidRequestError
from rt.gpu.radix_cache import TreeNode
from rt.gpu.sampling_params import SamplingParams

FinishReason = Literal["stop", "length", "abort", "finish"]


@dataclass(eq=False)
class Req:
    """One sequence being generated (a request with ``n > 1`` is ``n`` of these).

    KV bookkeeping, over positions of ``token_ids`` (prompt + outputs):
    ``prefix_len`` ≤ ``kv_len`` ≤ ``alloc_len``. Positions below ``prefix_len``
    (page-aligned) are slots held by the radix tree and locked through
    ``last_node``; positions ``prefix_len .. alloc_len`` are slots this request
    owns. ``kv_len`` positions have their KV computed.
    """

    rid: str
    index: int
    input_ids: list[int]
    params: SamplingParams
    seed: int
    priority: int
    arrival: int
    # outputs so far, a resubmission's prior tokens included (reported only as they are made)
    output_ids: list[int] = field(default_factory=list)
    row: int = -1
    prefix_len: int = 0
    kv_len: int = 0
    alloc_len: int = 0
    last_slot: int = -1  # slot of position alloc_len - 1 (saves a device read per decode step)
    last_node: TreeNode | None = None
    cached_tokens: int | None = None  # the radix hit at first admission
    admitted_at: float = 0.0  # time.monotonic() at first admission (its queue time's end)
    finish_reason: FinishReason | None = None
    matched_stop: int | None = None
    stop_ids: frozenset[int] | None = None  # stop_token_ids and EOS, made at the first look
    num_retractions: int = 0
    decoding: bool = (
        False  # False while the prompt (or, after a retraction, prompt + outputs) is prefilled
    )
    gate: Req | None = None  # an n>1 sibling whose prompt prefill this one waits for
    attempt: int = 0  # the frontend's resumption count of this request: stamped on outputs
    # prompt logprobs: computed by the request's first child, reported with its first token
    wants_prompt_logprobs: bool = False
    prompt_logprobs: list[float] = field(default_factory=list)  # of input_ids[1:], so far
    prompt_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)

    @property
    def computing_prompt_logprobs(self) -> bool:
        """Its prefill must compute the prompt's logprobs (so it cannot start from the cache)."""
        return self.wants_prompt_logprobs and len(self.prompt_logprobs) < len(self.input_ids) - 1

    @property
    def key(self) -> tuple[str, int]:
        return (self.rid, self.index)

    @property
    def token_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def num_new(self) -> int:
        """Tokens generated for this sequence, over every submission (``max_new_tokens``
        and ``min_new_tokens`` count these)."""
        return len(self.output_ids)

    @property
    def remaining_new(self) -> int:
        return self.params.max_new_tokens - self.num_new


@dataclass
class ReqOutput:
    """What one step produced for one sequence: new tokens, and the finish if it finished."""

    rid: str
    index: int
    token_ids: list[int]
    token_offset: int = 0  # index of token_ids[0] in the sequence's output (priors included)
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: FinishReason | None = None
    matched_stop: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    seed: int = 0
    # when the request was first admitted (time.monotonic()); a timing, not part of the output
    admitted_at: float = field(default=0.0, compare=False)
    prompt_logprobs: list[float] | None = None  # with the first token, when asked for
    prompt_top_logprobs: list[list[tuple[int, float]]] | None = None
    attempt: int = 0  # its request's attempt (Req.attempt)


@dataclass
class StepOutput:
    """Everything one ``step()`` produced, in the order it happened."""

    outputs: list[ReqOutput] = field(default_factory=list)
    num_tokens: int = 0  # tokens that went through the model
    forward_mode: Literal["extend", "decode", "idle"] = "idle"


def check_ids(field: str, ids: Sequence[int], vocab: int) -> None:
    bad = next((t for t in ids if not (isinstance(t, int) and 0 <= t < vocab)), None)
    if bad is not None:
        raise InvalidRequestError(f"{field}: expected token ids in [0, {vocab}), got {bad!r}")


def prior_outputs(
    params: SamplingParams,
    output_ids: Sequence[Sequence[int]],
    finished: Collection[int],
    vocab: int,
) -> list[list[int] | None]:
    """Each child's prior tokens (a request resumed), validated; ``None`` for a
    finished child (not to run)."""
    n = params.n
    if len(output_ids) not in (0, n):
        raise InvalidRequestError(
            f"output_ids: expected one sequence of prior tokens per child (n={n}) or none, "
            f"got {len(output_ids)}"
        )
    bad = [i for i in finished if not (isinstance(i, int) and 0 <= i < n)]
    if bad:
        raise InvalidRequestError(f"finished: expected child indices in [0, {n}), got {bad[0]!r}")
    priors: list[list[int] | None] = []
    for index in range(n):
        if index in finished:
            priors.append(None)
            continue
        prior = list(output_ids[index]) if output_ids else []
        check_ids(f"output_ids[{index}]", prior, vocab)
        if len(prior) >= params.max_new_tokens:
            raise InvalidRequestError(
                f"output_ids[{index}]: expected fewer than max_new_tokens="
                f"{params.max_new_tokens} prior tokens for a child that is not finished, "
                f"got {len(prior)}; list the child in finished"
            )
        priors.append(prior)
    return priors

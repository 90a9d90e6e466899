"""Vectorised sampling: penalties, filters and seeded Gumbel-max over the whole batch.

A sampled token is a pure function of (seed, position, logits): the noise for
vocabulary entry v comes from a counter-based hash of (seed, position, v), not
from a generator whose state depends on what else was in the batch.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from rt.gpu.sampling_params import SEED_MASK, SamplingParams

_M32 = 0xFFFFFFFF


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """A lowbias32-style finalizer, in place: ``x`` (int64, values < 2**32) is
    overwritten. Constants < 2**31, so int64 products never overflow. In place
    because the [batch, vocab] tensors are large: a fresh one per operation cost
    the draw twice its time at batch 64 (allocation and page faults)."""
    x ^= x >> 16
    x *= 0x7FEB352D
    x &= _M32
    x ^= x >> 15
    x *= 0x1B873593
    x &= _M32
    x ^= x >> 16
    return x


_VOCAB_TERMS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _vocab_term(vocab_size: int, device: torch.device) -> torch.Tensor:
    """Each token id's part of the hash: the same in every draw, so made once."""
    key = (vocab_size, device)
    if key not in _VOCAB_TERMS:
        vocab = torch.arange(vocab_size, device=device, dtype=torch.int64)
        _VOCAB_TERMS[key] = (vocab * 0x9E3779B1) & _M32
    return _VOCAB_TERMS[key]


def seeded_uniform(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniforms in (0, 1), [batch, vocab_size] float32, from (seed, position, token id) only."""
    seeds = seeds.to(torch.int64)
    row = _mix32_(positions.to(torch.int64) & _M32) ^ (seeds >> 32)
    row = _mix32_(_mix32_(row) ^ (seeds & _M32))
    h = _mix32_(row[:, None] ^ _vocab_term(vocab_size, seeds.device)[None, :])
    h ^= 0x2545F491
    h = _mix32_(h)
    # 23 bits: (h >> 9) + 0.5 is exact in float32, so u <= 1 - 2**-24 < 1. (With 24 bits the
    # top value rounded up to 1.0: noise +inf, which picked even a suppressed token.)
    h >>= 9
    u = h.to(torch.float32)
    u += 0.5
    u *= 1.0 / (1 << 23)
    return u


def child_seed(seed: int, index: int) -> int:
    """The seed of the ``index``-th of n parallel samples (index 0 keeps the request's seed)."""
    return seed if index == 0 else (seed + index * 0x9E3779B97F4A7C15) & SEED_MASK


@dataclass
class SampleRow:
    """What the sampler needs of one request."""

    params: SamplingParams
    seed: int
    position: int  # absolute index, in the full sequence, of the token being sampled
    input_ids: Sequence[
        int
    ]  # the prompt (with outputs: repetition penalty), referenced, not copied
    output_ids: Sequence[int]  # outputs so far (frequency/presence penalties)
    suppress_ids: Sequence[int]  # ids that must not be sampled now (stop ids before min_new_tokens)
    # the sequence (the engine's Req; hashable, weakly referenced) when the caller keeps it
    # from step to step and only appends to its outputs: its penalty state then stays on the
    # device while it lives, and a step adds the new tokens alone (_SeqCounts). None: the
    # state is made for this call only.
    owner: object | None = None


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float] | None
    top_ids: list[list[int]] | None
    top_logprobs: list[list[float]] | None


def sample(
    logits: torch.Tensor, rows: Sequence[SampleRow], use_kernel: bool = False
) -> SampleResult:
    """logits: [batch, vocab] (any float dtype) → one token per row.

    With ``use_kernel`` temperature, the filters and the seeded draw run in one
    Triton kernel (kernels/sampling.py), which draws the same tokens.
    """
    return sample_async(logits, rows, use_kernel).result()


class PendingSample:
    """Tokens drawn on the device whose copy to the host may still be running.

    ``tokens`` (on the device) can feed the next forward pass at once; ``result()``
    waits for the copy alone, not for work queued after it (overlap scheduling).
    """

    def __init__(
        self,
        tokens: torch.Tensor,
        logprobs: torch.Tensor | None,
        top: tuple[torch.Tensor, torch.Tensor] | None,
        top_counts: list[int],
    ) -> None:
        self.tokens = tokens
        self._top_counts = top_counts
        non_blocking = tokens.device.type == "cuda"
        host = [tokens, logprobs, *(top or ())]
        self._host = [
            t.to("cpu", non_blocking=non_blocking) if t is not None else None for t in host
        ]
        self._ready: torch.cuda.Event | None = None
        if non_blocking:
            self._ready = torch.cuda.Event()
            self._ready.record()

    def result(self) -> SampleResult:
        if self._ready is not None:
            self._ready.synchronize()
        tokens, logprobs, *top = self._host
        assert tokens is not None
        result = SampleResult(tokens.tolist(), None, None, None)
        if logprobs is not None:
            result.logprobs = logprobs.tolist()
        if top:
            ids, values = top
            assert ids is not None and values is not None
            counts = self._top_counts
            result.top_ids = [row[:k] for row, k in zip(ids.tolist(), counts, strict=True)]
            result.top_logprobs = [row[:k] for row, k in zip(values.tolist(), counts, strict=True)]
        return result


def sample_async(
    logits: torch.Tensor, rows: Sequence[SampleRow], use_kernel: bool = False
) -> PendingSample:
    """:func:`sample`, queued on the logits' device: nothing waits for the draw."""
    device, (bs, vocab) = logits.device, logits.shape
    logits = logits.float()
    params = [r.params for r in rows]
    want_lp = any(p.logprobs or p.top_logprobs for p in params)
    raw_logprobs = torch.log_softmax(logits, dim=-1) if want_lp else None

    if any(p.logit_bias for p in params):
        logits = logits + _dense_bias(params, bs, vocab, device)
    if any(p.allowed_token_ids is not None for p in params):
        logits = _only_allowed(logits, params)
    if any(p.has_penalties for p in params):
        logits = _apply_penalties(logits, rows)
    suppress = [(i, t) for i, r in enumerate(rows) for t in r.suppress_ids]
    if suppress:
        idx = torch.tensor(suppress, device=device).T
        logits = logits.index_put((idx[0], idx[1]), torch.tensor(float("-inf"), device=device))

    all_greedy = all(p.greedy for p in params)
    if all_greedy:
        tokens = logits.argmax(dim=-1)
    elif use_kernel:
        from kernels.sampling import sample_tokens

        tokens = sample_tokens(
            logits,
            torch.tensor(
                [0.0 if p.greedy else float(p.temperature) for p in params], device=device
            ),
            torch.tensor([p.top_k if 0 < p.top_k < vocab else 0 for p in params], device=device),
            torch.tensor([float(p.top_p) for p in params], device=device),
            torch.tensor([float(p.min_p) for p in params], device=device),
            torch.tensor([r.seed for r in rows], device=device),
            torch.tensor([r.position for r in rows], device=device),
        )
    else:
        temps = torch.tensor(
            [1.0 if p.greedy else float(p.temperature) for p in params],
            dtype=torch.float32,
            device=device,
        )
        scaled = _filter(logits / temps[:, None], params, vocab)
        u = seeded_uniform(
            torch.tensor([r.seed for r in rows], device=device),
            torch.tensor([r.position for r in rows], device=device),
            vocab,
        )
        gumbel = u.log_().neg_().log_()  # log(-log(u)), in place (u is ours)
        tokens = (scaled - gumbel).argmax(dim=-1)
        if any(p.greedy for p in params):  # (an argmax of its own only where some row is greedy)
            greedy = torch.tensor([p.greedy for p in params], device=device)
            tokens = torch.where(greedy, logits.argmax(dim=-1), tokens)

    logprobs = top = None
    if raw_logprobs is not None:
        logprobs = raw_logprobs.gather(1, tokens[:, None])[:, 0]
        k = max(p.top_logprobs for p in params)
        if k:
            values, ids = raw_logprobs.topk(k, dim=-1)
            top = (ids, values)
    return PendingSample(tokens, logprobs, top, [p.top_logprobs for p in params])


def _groups(
    params: Sequence[SamplingParams], wants: Callable[[SamplingParams], object]
) -> Iterator[tuple[SamplingParams, list[int]]]:
    """The rows whose params ``wants``, grouped by their params object (a request's
    n children share one): each group is one index_put of the request's cached ids."""
    groups: dict[int, tuple[SamplingParams, list[int]]] = {}
    for i, p in enumerate(params):
        if wants(p):
            groups.setdefault(id(p), (p, []))[1].append(i)
    return iter(groups.values())


def _dense_bias(
    params: Sequence[SamplingParams], bs: int, vocab: int, device: torch.device
) -> torch.Tensor:
    """[bs, vocab] float32: each row's ``logit_bias``, zero elsewhere.

    The host work per step is a pass over the rows, whatever the number of keys.
    (Rebuilt per row and step, 256 rows with 4096 keys took ~270 ms of the host's
    time; now ~4.)
    """
    bias = torch.zeros(bs, vocab, dtype=torch.float32, device=device)
    for p, rows in _groups(params, lambda p: p.logit_bias):
        ids, values = _on_device(p, device, "logit_bias", _bias_tensors)
        at = torch.tensor(rows, dtype=torch.int64, device=device)
        bias[at[:, None], ids] = values  # [rows, k], the biases broadcast
    return bias


def _only_allowed(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """``logits`` with -inf at every id a row's ``allowed_token_ids`` leaves out."""
    device = logits.device
    keep = torch.tensor([p.allowed_token_ids is None for p in params], device=device)
    keep = keep[:, None].repeat(1, logits.shape[1])
    for p, rows in _groups(params, lambda p: p.allowed_token_ids is not None):
        (ids,) = _on_device(p, device, "allowed_token_ids", _allowed_tensor)
        at = torch.tensor(rows, dtype=torch.int64, device=device)
        keep[at[:, None], ids] = True
    return logits.masked_fill(~keep, float("-inf"))


def _bias_tensors(params: SamplingParams, device: torch.device) -> tuple[torch.Tensor, ...]:
    return (
        torch.tensor(list(params.logit_bias), dtype=torch.int64, device=device),  # [k]
        torch.tensor(
            [float(v) for v in params.logit_bias.values()], dtype=torch.float32, device=device
        ),
    )


def _allowed_tensor(params: SamplingParams, device: torch.device) -> tuple[torch.Tensor, ...]:
    return (torch.tensor(params.allowed_token_ids, dtype=torch.int64, device=device),)


# (id(params), device, field) → (a weak reference to params, its tensors). Keyed by id
# since SamplingParams holds a dict and cannot be hashed; an entry goes with its params
# object (the reference's callback), that is once the request's last sequence is dropped.
# Module-level like _VOCAB_TERMS: the sampler is a set of functions with no owner to hold it.
_ON_DEVICE: dict[
    tuple[int, torch.device, str], tuple[weakref.ref[SamplingParams], tuple[torch.Tensor, ...]]
] = {}


def _on_device(
    params: SamplingParams,
    device: torch.device,
    name: str,
    make: Callable[[SamplingParams, torch.device], tuple[torch.Tensor, ...]],
) -> tuple[torch.Tensor, ...]:
    """A request's field ``name`` as device tensors, made once for all its steps and
    rows, and cached while ``params`` lives. The field is read once: it must not
    change while the request runs (nothing in rt changes it; SamplingParams is
    frozen, its dict is not)."""
    key = (id(params), device, name)
    held = _ON_DEVICE.get(key)
    if held is not None and held[0]() is params:
        return held[1]
    tensors = make(params, device)

    def forget(ref: weakref.ref[SamplingParams]) -> None:
        held = _ON_DEVICE.get(key)
        if held is not None and held[0] is ref:  # not a later object that reused the id
            _ON_DEVICE.pop(key, None)

    _ON_DEVICE[key] = (weakref.ref(params, forget), tensors)
    return tensors


class _Pool:
    """The penalty state of the live sequences on one device, a row each: one gather a
    step makes the batch's rows, one accumulate adds their new tokens. Row 0 stays
    zero (the rows without penalties). Sequences hold their pool (_SeqCounts.pool), so
    it goes with the last of them: _POOLS holds it weakly."""

    def __init__(self, device: torch.device, vocab: int) -> None:
        self.device, self.vocab = device, vocab
        self.counts = torch.zeros(1, vocab, dtype=torch.float32, device=device)  # [rows, vocab]
        self.prompt = torch.zeros(1, vocab, dtype=torch.bool, device=device)  # [rows, vocab]
        self.free: list[int] = []  # appended to by _SeqCounts.__del__, from any thread

    def take(self) -> int:
        """A free row, zeroed; the pool doubles when it has none."""
        if not self.free:
            rows = self.counts.shape[0]
            self.counts = torch.cat([self.counts, self.counts.new_zeros(rows, self.vocab)])
            self.prompt = torch.cat([self.prompt, self.prompt.new_zeros(rows, self.vocab)])
            self.free.extend(range(2 * rows - 1, rows - 1, -1))
        slot = self.free.pop()
        self.counts[slot] = 0
        self.prompt[slot] = False
        return slot


class _SeqCounts:
    """One sequence's row of a _Pool: how often each token id is among its first
    ``counted`` outputs (the last of them ``last``), and, for a repetition penalty
    (``with_prompt``), which ids are in its prompt of ``prompt_len`` tokens."""

    slot = 0  # none yet (row 0 is never taken): __del__ runs even if take() raised

    def __init__(self, pool: _Pool, input_ids: Sequence[int], with_prompt: bool) -> None:
        self.pool = pool
        self.slot = pool.take()
        self.prompt_len = len(input_ids)
        self.with_prompt = with_prompt
        self.counted = 0
        self.last = -1
        if with_prompt and input_ids:
            ids = torch.tensor(list(input_ids), dtype=torch.int64, device=pool.device)
            pool.prompt[self.slot, ids] = True

    def __del__(self) -> None:
        if self.slot:
            self.pool.free.append(self.slot)  # (atomic: the collector may run this anywhere)

    def trusted(self, row: SampleRow, pool: _Pool, with_prompt: bool) -> bool:
        """Whether ``row``'s ids can extend this state: same pool and prompt, and
        outputs that only grew since (checked at the last id counted, O(1))."""
        out, counted = row.output_ids, self.counted
        return (
            self.pool is pool
            and self.prompt_len == len(row.input_ids)
            and (self.with_prompt or not with_prompt)
            and counted <= len(out)
            and (counted == 0 or out[counted - 1] == self.last)
        )


# Module-level like _ON_DEVICE: (device, vocab) → the pool its sequences hold, and a sequence
# (SampleRow.owner) → its state, dropped with the sequence.
_POOLS: weakref.WeakValueDictionary[tuple[torch.device, int], _Pool] = weakref.WeakValueDictionary()
_STATES: weakref.WeakKeyDictionary[object, _SeqCounts] = weakref.WeakKeyDictionary()


def _penalty_rows(
    rows: Sequence[SampleRow], vocab: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's output token counts ([bs, vocab] float32) and prompt ids ([bs, vocab]
    bool, with a repetition penalty only): zero for a row without penalties.

    A sequence's state is made at its first step (O(prompt + outputs)), or again when
    its ids cannot extend it (a resubmission is a new Req; a retracted one keeps its
    outputs); later steps add the tokens new since, so the host's work per step is
    O(rows + new tokens), whatever the lengths. (Rebuilt from the ids each step, the
    penalties of 16 rows with 4,000-token prompts took 5.3 ms a step on one CPU thread at
    vocab 4,096, 18 with 16,000-token prompts; kept, 0.7 to 0.9 either way, mostly the
    arithmetic on [rows, vocab] that both do.)
    """
    pool = _POOLS.get((device, vocab))
    if pool is None:
        pool = _POOLS[(device, vocab)] = _Pool(device, vocab)
    slots: list[int] = []
    held: list[_SeqCounts] = []  # an owner-less row's state lives until its row is read
    new_slots: list[int] = []
    new_ids: list[int] = []
    for r in rows:
        if not r.params.has_penalties:
            slots.append(0)
            continue
        with_prompt = r.params.repetition_penalty != 1.0
        state = _STATES.get(r.owner) if r.owner is not None else None
        if state is None or not state.trusted(r, pool, with_prompt):
            state = _SeqCounts(pool, r.input_ids, with_prompt)
            if r.owner is not None:
                _STATES[r.owner] = state
        held.append(state)
        new = list(r.output_ids[state.counted :])
        if new:
            new_slots += [state.slot] * len(new)
            new_ids += new
            state.counted += len(new)
            state.last = new[-1]
        slots.append(state.slot)
    if new_ids:
        at = torch.tensor([new_slots, new_ids], dtype=torch.int64, device=device)
        one = torch.tensor(1.0, device=device)
        pool.counts.index_put_((at[0], at[1]), one, accumulate=True)
    at = torch.tensor(slots, dtype=torch.int64, device=device)
    return pool.counts[at], pool.prompt[at]


def _apply_penalties(logits: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
    device = logits.device
    params = [r.params for r in rows]
    freq = torch.tensor([float(p.frequency_penalty) for p in params], device=device)
    pres = torch.tensor([float(p.presence_penalty) for p in params], device=device)
    counts, in_prompt = _penalty_rows(rows, logits.shape[1], device)
    # a row without these penalties has zero counts: its ±0 penalty times any count is the same
    logits = logits - freq[:, None] * counts - pres[:, None] * (counts > 0).float()
    # (asked of the host: a device check waited for the device each step; where every
    # penalty is 1 the division and product below leave the logits as they are)
    if any(p.repetition_penalty != 1.0 for p in params):
        rep = torch.tensor([float(p.repetition_penalty) for p in params], device=device)
        seen = in_prompt | (counts > 0)
        penalised = torch.where(logits > 0, logits / rep[:, None], logits * rep[:, None])
        logits = torch.where(seen, penalised, logits)
    return logits


def _filter(logits: torch.Tensor, params: Sequence[SamplingParams], vocab: int) -> torch.Tensor:
    """Mask (to -inf) tokens outside top-k, top-p and min-p. logits: [batch, vocab], temperature applied."""
    device = logits.device
    neg_inf = torch.tensor(float("-inf"), device=device)
    if any(p.min_p > 0 for p in params):
        min_p = torch.tensor([float(p.min_p) for p in params], device=device)
        probs = torch.softmax(logits, dim=-1)
        logits = torch.where(
            probs < min_p[:, None] * probs.max(dim=-1, keepdim=True).values, neg_inf, logits
        )
    use_k = any(0 < p.top_k < vocab for p in params)
    use_p = any(p.top_p < 1.0 for p in params)
    if not (use_k or use_p):
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=device)[None, :]
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if use_k:
        top_k = torch.tensor(
            [p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device
        )
        drop |= rank >= top_k[:, None]
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    if use_p:
        top_p = torch.tensor([float(p.top_p) for p in params], device=device)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked before it already cover top_p; the first
        # always stays (also for a top_p that float32 rounds to 0: it dropped every token)
        drop |= ((probs.cumsum(dim=-1) - probs) >= top_p[:, None]) & (rank > 0)
    return logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))

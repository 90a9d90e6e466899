"""The engine core: add requests, step, abort. Synchronous; a scheduler actor wraps it.

``step()`` may run in a worker thread while another thread calls
``add_request``, ``abort`` or ``finish``: those validate and then only append
to deques (atomic in CPython) that the next ``step()`` drains, so the core's
structures are touched by one thread at a time. Call ``step()`` from one
thread at a time, and ``flush_cache``/``check_integrity`` only between steps.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

import torch

from rt.errors import ContextOverflowError, InvalidRequestError
from rt.gpu.engine_config import EngineConfig
from rt.gpu.engine_setup import EngineParts, build_parts
from rt.gpu.forward_batch import ForwardBatch
from rt.gpu.model_runner import ScheduledReq
from rt.gpu.request import FinishReason, Req, ReqOutput, StepOutput, check_ids, prior_outputs
from rt.gpu.sampler import PendingSample, SampleRow, child_seed, sample_async
from rt.gpu.sampling_params import SEED_MASK, SamplingParams

log = logging.getLogger(__name__)
WARM_UP_TOKENS = 3  # new tokens of each warm-up request: a prefill, then decodes


@dataclass
class _Pending:
    """A step's draw, not read back yet: ``reqs[i]``'s token sits at
    ``output_ids[offsets[i]]`` as ``-(i + 1)`` until :meth:`EngineCore._resolve`."""

    sample: PendingSample
    reqs: list[Req]
    offsets: list[int]


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    max_total_tokens: int
    free_tokens: int  # in free pages
    cached_tokens: int  # held by the radix tree (in use or evictable)
    evictable_tokens: int
    num_retractions: int


class EngineCore:
    """Continuous batching over a paged, prefix-shared KV cache."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        parts: EngineParts = build_parts(config)
        # tokenizer file, chat template, generation defaults (None without a model directory)
        self.model_files = parts.model_files
        self.model_config = parts.model_config
        self.eos_token_ids = parts.eos_token_ids
        self.context_length = parts.context_length
        self.cache = parts.cache
        self.runner = parts.runner
        self.prefill = parts.prefill
        self.decode = parts.decode
        self.max_total_tokens = self.cache.allocator.capacity * config.page_size
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked: Req | None = None
        self.reqs: dict[str, list[Req]] = {}
        self._left: dict[str, int] = {}  # per rid, its samples not finished yet
        self._ended = 0  # finished since running and waiting were last cleared of them
        self._incoming: deque[Req] = deque()
        self._commands: deque[tuple[str, str, int | None]] = deque()  # (what, rid, index)
        self._arrival = itertools.count()
        self._seed_rng = random.Random(config.seed)
        self._new_token_ratio = config.new_token_ratio
        self.num_retractions = 0
        # overlap scheduling: the last step's draw, read once the next step is launched
        self.overlap = config.use_overlap
        self._pending: _Pending | None = None

    # ---- requests in -------------------------------------------------------------

    def add_request(
        self,
        rid: str,
        input_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        output_ids: Sequence[Sequence[int]] = (),
        finished: Collection[int] = (),
        priority: int = 0,
        attempt: int = 0,
        to_context: bool = False,
    ) -> None:
        """Queue a request; thread-safe, the next step sees it.

        ``params`` are the request's own, also when it is resubmitted after a
        scheduler restart. A resubmission passes what each child already has:
        ``output_ids[i]`` the tokens of child ``i`` (one sequence per child, or
        none at all), and ``finished`` the indices of children that are done.
        Finished children are not run again and nothing is reported for them;
        the others resume after their prior tokens, which count against
        ``max_new_tokens`` and ``min_new_tokens``, for penalties and for sampling
        positions, and are never reported again (a step's ``token_offset``
        for child ``i`` starts at ``len(output_ids[i])``). Child ``i`` samples
        with ``child_seed(seed, i)`` at each position, so a seeded child resumes
        exactly where it was. A request whose children are all finished queues
        nothing.

        With the ``priority`` policy a higher ``priority`` is admitted first.
        ``attempt`` is only carried: every output of the request reports it.
        ``to_context``: ``max_new_tokens`` is the room the prompt leaves in the
        context (a chat's default), cut here to the room it leaves in the KV pool
        where that is smaller (the same cut for a resubmission).
        Raises InvalidRequestError for bad ids or parameters and
        ContextOverflowError when the request could never fit the context or
        the KV pool.
        """
        params = params or SamplingParams()
        vocab = self.model_config.vocab_size
        if rid in self.reqs:
            raise InvalidRequestError(
                f"rid: expected a new request id, {rid!r} is already in flight"
            )
        if len(input_ids) == 0:
            raise InvalidRequestError("input_ids: expected at least one token id, got none")
        params.validate(vocab)
        check_ids("input_ids", input_ids, vocab)
        room = self.max_total_tokens - len(input_ids)
        if to_context and params.max_new_tokens > room:
            if room < max(params.min_new_tokens, 1):
                raise ContextOverflowError(
                    f"the prompt has {len(input_ids)} tokens, which leave room for "
                    f"{max(room, 0)} new tokens in the KV pool ({self.max_total_tokens} tokens)"
                    + (f", fewer than min_new_tokens ({params.min_new_tokens})" if room > 0 else "")
                )
            params = replace(params, max_new_tokens=room)
        priors = prior_outputs(params, output_ids, finished, vocab)
        total = len(input_ids) + params.max_new_tokens
        if total > self.context_length:
            raise ContextOverflowError(
                f"prompt ({len(input_ids)} tokens) + max_new_tokens ({params.max_new_tokens}) = "
                f"{total} exceeds the context length {self.context_length}; shorten the prompt "
                "or lower max_new_tokens"
            )
        if len(input_ids) >= self.max_total_tokens:  # (and the token it must make)
            raise ContextOverflowError(
                f"the prompt has {len(input_ids)} tokens, more than the KV pool holds with "
                f"a token to make ({self.max_total_tokens} tokens); shorten the prompt or grow "
                "the pool"
            )
        if total > self.max_total_tokens:
            raise ContextOverflowError(
                f"prompt ({len(input_ids)} tokens) + max_new_tokens ({params.max_new_tokens}) = "
                f"{total} exceeds the KV pool ({self.max_total_tokens} tokens); lower "
                "max_new_tokens or grow the pool"
            )
        seed = (
            params.seed if params.seed is not None else self._seed_rng.getrandbits(63) & SEED_MASK
        )
        children: list[Req] = []
        for index, prior in enumerate(priors):
            if prior is None:
                continue
            req = Req(
                rid=rid,
                index=index,
                input_ids=list(input_ids),
                params=params,
                seed=child_seed(seed, index),
                priority=priority,
                arrival=next(self._arrival),
                output_ids=prior,
                attempt=attempt,
            )
            if children:
                req.gate = children[0]  # waits until that sibling has cached the shared prompt
            else:
                req.wants_prompt_logprobs = params.prompt_logprobs
            children.append(req)
        if children:
            self.reqs[rid] = children
            self._left[rid] = len(children)
            self._incoming.extend(children)

    def abort(self, rid: str) -> None:
        """Abort ``rid`` at the start of the next step (thread-safe); the step reports it."""
        self._commands.append(("abort", rid, None))

    def finish(self, rid: str, index: int | None = None) -> None:
        """Finish ``rid`` now, as if it had stopped (thread-safe), or only its sample
        ``index``; the next step reports it."""
        self._commands.append(("finish", rid, index))

    # ---- the step ---------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return bool(
            self.waiting
            or self.running
            or self.chunked
            or self._incoming
            or self._commands
            or self._pending
        )

    def retract_all(self) -> int:
        """Give back the KV of every admitted request, what each computed kept in the
        prefix cache, and queue them to be admitted again (SGLang's pause mode
        retract: a flush can then drop it all, and they compute it again after, with
        the weights then loaded). Returns how many. Call between steps, after
        ``apply_commands()``."""
        held = [*self.running, *([self.chunked] if self.chunked is not None else [])]
        for req in held:
            self.cache.release(req, cache=True)
            req.decoding = False
        self.running, self.chunked = [], None
        self.waiting[:0] = held  # (first in line again)
        return len(held)

    @property
    def holds_kv(self) -> bool:
        """A request holds KV (a table row: admitted, not finished nor retracted)."""
        return any(req.row >= 0 for reqs in self.reqs.values() for req in reqs)

    @property
    def has_pending(self) -> bool:
        """A step's tokens are drawn but not reported yet (overlap scheduling): the
        next ``step()`` or ``apply_commands()`` reports them."""
        return self._pending is not None

    @property
    def next_step_prefills(self) -> bool:
        """Whether the next ``step()`` may run a prefill (an extend), whose length
        the caller cannot bound; otherwise it decodes the running requests or
        does nothing. Conservative: a request waiting for room counts, and it
        is never False before a step that prefills. Call between steps."""
        return bool(self.chunked or self._incoming or self.waiting)

    @property
    def has_commands(self) -> bool:
        """Aborts or finishes not applied yet."""
        return bool(self._commands)

    def apply_commands(self) -> StepOutput:
        """Apply pending aborts and finishes alone, with no forward pass (while
        generation is paused), after reporting the tokens of the last step. Call
        between steps."""
        out = StepOutput()
        while self._incoming:
            self.waiting.append(self._incoming.popleft())
        self._resolve(out)
        self._apply_commands(out)
        return out

    def step(self) -> StepOutput:
        """Run one forward pass (an extend, or a decode of every running request)."""
        out = StepOutput()
        while self._incoming:
            self.waiting.append(self._incoming.popleft())
        self._apply_commands(out)
        plan = self.prefill.plan(self.waiting, self.running, self.chunked, self._new_token_ratio)
        self.chunked = plan.chunked
        if plan.requeued is not None:
            self.waiting.append(plan.requeued)
        if plan.items:
            out.forward_mode = "extend"
            self._run(plan.items, out)
            return out
        if self.running and self._pending is not None and not self.decode.fits(self.running):
            # the last draw's requests that it ends hold KV till it is read: read it now
            # (this step not overlapped), else retraction found no page it could free
            # and the scheduler crashed ("decode allocation failed after retraction")
            self._resolve(out)
            self._drop_ended()
        if self.running:
            items, retracted = self.decode.plan(self.running)
            if retracted:
                self.num_retractions += len(retracted)
                self.waiting.extend(retracted)
                self._new_token_ratio = 1.0
                log.info("KV pool full: retracted %d request(s)", len(retracted))
            else:
                self._new_token_ratio = max(
                    self.config.new_token_ratio,
                    self._new_token_ratio - self.config.new_token_ratio_decay,
                )
            out.forward_mode = "decode"
            self._run(items, out)
        else:
            self._resolve(out)
        return out

    def _run(self, items: list[ScheduledReq], out: StepOutput) -> None:
        """Launch the forward pass of ``items`` and their draw; with overlap, report
        the previous step's tokens meanwhile and this step's at the next."""
        pending = self._pending.sample.tokens if self._pending is not None else None
        batch = self.runner.build_batch(items, self.cache.table.slots.device, pending)
        logits = self.runner.forward(batch)
        if batch.sampled_rows is not None:
            self._prompt_logprobs(items, batch, logits)
            logits = logits[batch.sampled_rows]
        out.num_tokens = batch.input_ids.shape[0]
        samples = [item.samples for item in items]
        to_sample = [item.req for item, s in zip(items, samples, strict=True) if s]
        for item in items:
            item.req.kv_len += item.extend_len
        for item, sampled in zip(items, samples, strict=True):
            req = item.req
            if not sampled:
                self.cache.cache_prefix(req)  # a chunk boundary
            elif not req.decoding:
                req.decoding = True
                self.cache.cache_prefix(req)
                self.running.append(req)
        # the device runs this step while the last one's tokens are read and reported
        # (penalties below need them); a request they finish decoded once for nothing
        self._resolve(out)
        if to_sample:
            rows = [self._sample_row(r) for r in to_sample]
            drawn = sample_async(logits, rows, self.runner.ops.sampling_kernel)
            self._pending = _Pending(drawn, to_sample, [len(r.output_ids) for r in to_sample])
            done = set()
            for i, req in enumerate(to_sample):
                if req.finish_reason is not None:  # ended as the last step was read
                    continue
                req.output_ids.append(-(i + 1))
                if self._must_end(req, req.num_new):
                    done.add(req)  # done whatever was drawn: not decoded again (KV stays till read)
            if done:
                self.running = [r for r in self.running if r not in done]
        if not self.overlap:
            self._resolve(out)

    def _resolve(self, out: StepOutput) -> None:
        """Read the last step's tokens back, put them in place and report them."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        result = pending.sample.result()
        for i, req in enumerate(pending.reqs):
            if req.finish_reason is not None:  # ended meanwhile: its token is dropped
                continue
            at, tok = pending.offsets[i], result.token_ids[i]
            req.output_ids[at] = tok
            o = ReqOutput(
                req.rid,
                req.index,
                [tok],
                token_offset=at,
                seed=req.seed,
                cached_tokens=req.cached_tokens or 0,
                admitted_at=req.admitted_at,
                attempt=req.attempt,
            )
            if result.logprobs is not None and (req.params.logprobs or req.params.top_logprobs):
                o.logprobs = [result.logprobs[i]]
                if (
                    req.params.top_logprobs
                    and result.top_ids is not None
                    and result.top_logprobs is not None
                ):
                    o.top_logprobs = [
                        list(zip(result.top_ids[i], result.top_logprobs[i], strict=True))
                    ]
            if req.wants_prompt_logprobs:  # its first token: the prompt's are complete
                req.wants_prompt_logprobs = False
                o.prompt_logprobs = req.prompt_logprobs
                if req.params.top_logprobs:
                    o.prompt_top_logprobs = req.prompt_top_logprobs
            reason = self._finish_reason(req, tok, at + 1)
            if reason is not None:
                del req.output_ids[at + 1 :]  # a token of the step after, never to be read
                self._finish(req, reason, o)
            out.outputs.append(o)
        self._drop_ended()

    def _prompt_logprobs(
        self, items: list[ScheduledReq], batch: ForwardBatch, logits: torch.Tensor
    ) -> None:
        """Each prompt token's logprob (and best alternatives) from the positions
        before it, for the requests that asked (``batch.prompt_spans``)."""
        for b, row, count, first in batch.prompt_spans:
            req = items[b].req
            lp = torch.log_softmax(logits[row : row + count].float(), dim=-1)
            target = torch.tensor(req.input_ids[first + 1 : first + 1 + count], device=lp.device)
            req.prompt_logprobs += lp.gather(1, target[:, None])[:, 0].tolist()
            k = req.params.top_logprobs
            if k:
                values, ids = lp.topk(min(k, lp.shape[1]), dim=-1)
                req.prompt_top_logprobs += [
                    list(zip(i, v, strict=True))
                    for i, v in zip(ids.tolist(), values.tolist(), strict=True)
                ]

    def _stop_ids(self, req: Req) -> frozenset[int]:
        """Made once per sequence: a set built per token from a long list held every step."""
        if req.stop_ids is None:
            eos = () if req.params.ignore_eos else self.eos_token_ids
            req.stop_ids = frozenset((*req.params.stop_token_ids, *eos))
        return req.stop_ids

    def _sample_row(self, req: Req) -> SampleRow:
        suppress = self._stop_ids(req) if req.num_new < req.params.min_new_tokens else ()
        allowed = req.params.allowed_token_ids
        if suppress and allowed is not None and suppress.issuperset(allowed):
            suppress = ()  # every id it may draw is a stop: drawn, not stopped at (min_new_tokens)
        return SampleRow(
            req.params, req.seed, req.seq_len, req.input_ids, req.output_ids, sorted(suppress), req
        )

    def _finish_reason(self, req: Req, tok: int, num_new: int) -> FinishReason | None:
        """Why ``req`` ends with ``tok``, its ``num_new``-th new token (None: it goes on)."""
        if tok in self._stop_ids(req) and num_new > req.params.min_new_tokens - 1:
            req.matched_stop = tok
            return "stop"
        if self._must_end(req, num_new):
            return "length"
        return None

    def _must_end(self, req: Req, num_new: int) -> bool:
        """Whether ``req`` ends at its ``num_new``-th new token, whichever token it is."""
        return (
            num_new >= req.params.max_new_tokens
            or len(req.input_ids) + num_new >= self.context_length
        )

    def _finish(self, req: Req, reason: FinishReason, o: ReqOutput) -> None:
        """Free ``req``'s KV (its prefix stays cached) and fill in the final output fields."""
        req.finish_reason = reason
        if req.row >= 0:
            self.cache.release(req, cache=reason != "abort")
        self._ended += 1  # out of running and waiting at the end of the pass (_drop_ended)
        if req is self.chunked:
            self.chunked = None
        o.finish_reason, o.matched_stop = reason, req.matched_stop
        o.prompt_tokens = len(req.input_ids)
        o.completion_tokens = req.num_new
        o.cached_tokens = req.cached_tokens or 0
        left = self._left.pop(req.rid, 1) - 1  # its samples still going
        if left > 0:
            self._left[req.rid] = left
        else:
            self.reqs.pop(req.rid, None)

    def _drop_ended(self) -> None:
        """Take the requests that ended out of ``running`` and ``waiting``, once a
        pass: one list walk each per request was quadratic (a client leaving 100
        prompts of n=1024 held a step for 35 s, and the watchdog killed it)."""
        if self._ended:
            self._ended = 0
            self.running = [r for r in self.running if r.finish_reason is None]
            self.waiting = [r for r in self.waiting if r.finish_reason is None]

    def _apply_commands(self, out: StepOutput) -> None:
        if self._commands:
            self._resolve(out)  # so that a request ends with every token it has
        while self._commands:
            command, rid, index = self._commands.popleft()
            reason: FinishReason = "abort" if command == "abort" else "finish"
            for req in list(self.reqs.get(rid, ())):
                if req.finish_reason is None and index in (None, req.index):
                    o = ReqOutput(
                        req.rid,
                        req.index,
                        [],
                        token_offset=len(req.output_ids),
                        seed=req.seed,
                        attempt=req.attempt,
                    )
                    self._finish(req, reason, o)
                    out.outputs.append(o)
        self._drop_ended()

    # ---- cache ---------------------------------------------------------------

    def flush_cache(self) -> int:
        """Drop every cached prefix no running request uses; return how many tokens were freed."""
        before = self.cache.tree.evictable_size
        self.cache.flush()
        return before - self.cache.tree.evictable_size

    # ---- start-up --------------------------------------------------------------

    def warm_up(self, record: Callable[[StepOutput, float], None] | None = None) -> int:
        """Serve a few throwaway requests, so that the first real ones do not pay
        for what runs once: a Triton kernel is compiled at its first launch for
        each class of its integer arguments (equal to 1, a multiple of 16, or
        neither), and libraries set themselves up at their first call.

        Prompts of 1, 16 and 17 tokens, each alone and then together (the 17 a
        prefix hit on the 16 where the cache is on), greedy and sampled, with
        penalties and logprobs, prefilled and decoded. Nothing stays: the
        prefix cache is flushed, and the arrival order, the stream of seeds for
        unseeded requests and the counters are as they were. ``record(out, s)``
        is told of each step and its seconds. Returns the number of steps.
        Call before any request is added."""
        if self.has_work:
            raise RuntimeError("warm_up: the engine already holds requests")
        vocab = self.model_config.vocab_size
        room = min(self.context_length, self.max_total_tokens)
        lengths = [n for n in (1, 16, 17) if n + WARM_UP_TOKENS <= room]
        kinds = [
            SamplingParams(temperature=0.0, logprobs=True),
            SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05),
            SamplingParams(frequency_penalty=0.5, repetition_penalty=1.1, top_logprobs=2),
        ]
        arrival = next(self._arrival)
        ratio, retractions = self._new_token_ratio, self.num_retractions
        steps = 0
        rounds = [[n] for n in lengths] + [lengths]
        for i, batch in enumerate(rounds):
            for j, n in enumerate(batch):
                params = replace(
                    kinds[(i + j) % len(kinds)],
                    max_new_tokens=WARM_UP_TOKENS,
                    ignore_eos=True,
                    seed=i * 8 + j,
                )
                ids = [(7 * k + 3) % vocab for k in range(n)]
                self.add_request(f"warm-up/{i}/{j}", ids, params)
            while self.has_work:
                start = time.perf_counter()
                out = self.step()
                if record is not None:
                    record(out, time.perf_counter() - start)
                steps += 1
        self.cache.flush()
        self._arrival = itertools.count(arrival)
        self._new_token_ratio, self.num_retractions = ratio, retractions
        return steps

    def check_integrity(self) -> None:
        """Assert the KV invariants: every slot free, owned by one live request, or held by the tree."""
        live = [r for r in self.running]
        if self.chunked is not None:
            live.append(self.chunked)
        if self._pending is not None:  # ended by length but not read back: KV still held
            live += [
                r
                for r in self._pending.reqs
                if r.row >= 0 and r.finish_reason is None and r not in live
            ]
        for req in self.waiting:
            assert req.row == -1 and req.last_node is None, "a waiting request holds KV"
        self.cache.check_integrity(live)

    def stats(self) -> EngineStats:
        """A snapshot for metrics and /server_info (call between steps)."""
        tree = self.cache.tree
        free = self.cache.allocator.num_free * self.config.page_size
        return EngineStats(
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            max_total_tokens=self.max_total_tokens,
            free_tokens=free,
            cached_tokens=tree.total_size,
            evictable_tokens=tree.evictable_size,
            num_retractions=self.num_retractions,
        )

    @property
    def num_running(self) -> int:
        return len(self.running) + (1 if self.chunked else 0)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self._incoming)

    @property
    def device(self) -> torch.device:
        return self.runner.device

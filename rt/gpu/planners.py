"""Which requests run in the next forward pass: prefill admission (with chunking) and decode (with retraction)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from rt.gpu.kv_cache import KVCacheManager
from rt.gpu.model_runner import ScheduledReq
from rt.gpu.request import Req
from rt.gpu.schedule_policy import order_waiting

# a running request's future tokens count at most this much in the admission reserve
RESERVE_CLIP = 4096


@dataclass
class PrefillPlan:
    items: list[ScheduledReq] = field(default_factory=list)
    admitted: list[Req] = field(default_factory=list)
    # the request whose prompt did not fit this step's budget and goes on next step
    chunked: Req | None = None
    # a chunked request that could not get pages: released, back to waiting
    requeued: Req | None = None


class PrefillPlanner:
    """Admits waiting requests while the token budget, the row count and the KV pool allow."""

    def __init__(
        self,
        cache: KVCacheManager,
        policy: str,
        max_running_requests: int,
        max_prefill_tokens: int,
        chunked_prefill_size: int | None,
    ) -> None:
        self.cache = cache
        self.policy = policy
        self.max_running_requests = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.chunked_prefill_size = chunked_prefill_size

    def _reserve_pages(self, reqs: list[Req], ratio: float) -> int:
        tokens = sum(min(r.remaining_new, RESERVE_CLIP) for r in reqs) * ratio
        return math.ceil(tokens / self.cache.page_size)

    def plan(
        self, waiting: list[Req], running: list[Req], chunked: Req | None, ratio: float
    ) -> PrefillPlan:
        """Remove admitted requests from ``waiting``; return what to run. Nothing to run: empty items."""
        cache, out = self.cache, PrefillPlan()
        chunk_size = self.chunked_prefill_size
        budget = min(self.max_prefill_tokens, chunk_size or self.max_prefill_tokens)
        if chunked is not None:
            n = min(chunked.seq_len - chunked.kv_len, budget)
            slots = cache.alloc(chunked, n)
            if slots is None:
                cache.release(chunked, cache=True)
                out.requeued = chunked
            else:
                out.items.append(ScheduledReq(chunked, n, slots))
                budget -= n
                if n < chunked.seq_len - chunked.kv_len:
                    out.chunked = chunked
                    return out
        if not waiting:
            return out
        num_active = len(running) + len(out.items)
        reserve = self._reserve_pages(running, ratio)
        for req in order_waiting(
            waiting, self.policy, cache.tree if cache.enable_prefix_cache else None
        ):
            if budget <= 0 or num_active >= self.max_running_requests or cache.table.num_free == 0:
                break
            if req.gate is not None and not (req.gate.decoding or req.gate.finish_reason):
                continue
            prefix_len = cache.admit(req)
            extend = req.seq_len - req.kv_len
            n = extend
            if extend > budget:
                if chunk_size is not None and out.chunked is None:
                    n = budget
                elif chunk_size is not None or out.items:
                    cache.release(req, cache=False)
                    break
            need = cache.pages_needed(req, n) + math.ceil((extend - n) / cache.page_size)
            if num_active:
                # room for the decode of those already running; alone, a request always fits
                # (admission checked prompt + max_new_tokens against the pool)
                need += reserve + self._reserve_pages([req], ratio)
            slots = cache.alloc(req, n) if need <= cache.available_pages else None
            if slots is None:
                cache.release(req, cache=False)
                break
            if req.cached_tokens is None:
                req.cached_tokens = prefix_len
                req.admitted_at = time.monotonic()
            out.items.append(ScheduledReq(req, n, slots))
            out.admitted.append(req)
            reserve += self._reserve_pages([req], ratio)
            budget -= n
            num_active += 1
            if n < extend:
                out.chunked = req
                break
        if out.admitted:  # in one walk: one per request was quadratic in a long queue
            admitted = set(out.admitted)
            waiting[:] = [r for r in waiting if r not in admitted]
        return out


class DecodePlanner:
    """One token for every running request; retracts requests when the pool cannot hold them."""

    def __init__(self, cache: KVCacheManager) -> None:
        self.cache = cache

    def fits(self, running: list[Req]) -> bool:
        """Whether the pool holds one more token of each of ``running`` as it is."""
        return sum(self.cache.pages_needed(r, 1) for r in running) <= self.cache.available_pages

    def plan(self, running: list[Req]) -> tuple[list[ScheduledReq], list[Req]]:
        """Remove retracted requests from ``running``; return (what to run, what was retracted)."""
        cache = self.cache
        need = sum(cache.pages_needed(r, 1) for r in running)
        retracted: list[Req] = []
        if need > cache.available_pages:
            # retract those that lose least work first: fewest new tokens, then longest prompt
            victims = sorted(running, key=lambda r: (r.num_new, -len(r.input_ids), -r.arrival))
            while need > cache.available_pages and len(running) > 1:
                victim = victims.pop(0)
                need -= cache.pages_needed(victim, 1)
                running.remove(victim)
                cache.release(victim, cache=False)
                victim.decoding = False
                victim.num_retractions += 1
                retracted.append(victim)
        slots = cache.alloc_decode(running)
        assert slots is not None, "decode allocation failed after retraction"
        return [ScheduledReq(req, 1, slots[i : i + 1]) for i, req in enumerate(running)], retracted

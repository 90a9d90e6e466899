"""The order in which waiting requests are considered for admission."""

from __future__ import annotations

from collections.abc import Sequence

from rt.gpu.radix_cache import RadixCache
from rt.gpu.request import Req

# longest-prefix-match costs a tree walk per request; past this many waiting, fall back to fcfs
LPM_MAX_QUEUE = 128


def order_waiting(waiting: Sequence[Req], policy: str, tree: RadixCache | None) -> list[Req]:
    """``fcfs``: arrival order. ``priority``: higher ``priority`` first, then arrival.
    ``lpm``: longest cached prefix first, then arrival."""
    if policy == "priority":
        return sorted(waiting, key=lambda r: (-r.priority, r.arrival))
    if policy == "lpm" and tree is not None and len(waiting) <= LPM_MAX_QUEUE:
        matched = {
            id(r): tree.match_prefix(r.token_ids[: r.seq_len - 1])[0].shape[0] for r in waiting
        }
        return sorted(waiting, key=lambda r: (-matched[id(r)], r.arrival))
    return sorted(waiting, key=lambda r: r.arrival)

"""The radix tree and the page allocator, alone and together (property-based)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rt.gpu.kv_cache import KVCacheManager, ReqTable
from rt.gpu.kv_pool import PageAllocator, pages_of
from rt.gpu.radix_cache import RadixCache
from rt.gpu.request import Req
from rt.gpu.sampling_params import SamplingParams


def slots_for(pages: list[int], page_size: int) -> torch.Tensor:
    return (torch.tensor(pages)[:, None] * page_size + torch.arange(page_size)).flatten()


def test_match_insert_split_and_lru_eviction() -> None:
    tree = RadixCache(page_size=2)
    a = [1, 2, 3, 4, 5, 6]
    assert tree.insert(a, torch.arange(10, 16)) == 0
    value, node = tree.match_prefix([1, 2, 3, 4, 9, 9])
    assert value.tolist() == [10, 11, 12, 13] and node.key == [
        1,
        2,
        3,
        4,
    ]  # split at a page boundary
    assert tree.match_prefix([1, 2, 3, 9])[0].tolist() == [10, 11]  # partial page: not matched
    assert tree.insert([1, 2, 3, 4, 7, 8], torch.arange(20, 26)) == 4
    tree.inc_lock(node)
    assert (tree.evictable_size, tree.protected_size) == (4, 4)
    tree.check_integrity()
    tree.match_prefix([1, 2, 3, 4, 7, 8])  # [7, 8] is now more recent than [5, 6]
    freed: list[list[int]] = []
    assert tree.evict(2, lambda v: freed.append(v.tolist())) == 2
    assert freed == [[14, 15]]
    assert tree.evict(100, lambda v: freed.append(v.tolist())) == 2  # the locked path stays
    tree.dec_lock(node)
    assert tree.evict(100, lambda v: freed.append(v.tolist())) == 4
    assert tree.total_size == 0
    tree.check_integrity()


def test_allocator_hands_out_each_page_once() -> None:
    alloc = PageAllocator(num_pages=5, page_size=4)
    assert alloc.capacity == 4
    got = alloc.alloc(3)
    assert got == [1, 2, 3] and alloc.alloc(2) is None
    alloc.free(got[:2])
    assert sorted(alloc.free_pages()) == [1, 2, 4]
    assert pages_of(torch.tensor([4, 5, 9, 0]), 4) == [1, 2, 0]


ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "step", "decode", "finish", "retract", "evict"]),
        st.integers(0, 7),
        st.integers(1, 9),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops=ops, page_size=st.sampled_from([1, 2, 4]))
def test_cache_manager_keeps_every_page_owned_once(
    ops: list[tuple[str, int, int]], page_size: int
) -> None:
    """Random admissions, extends, chunk-boundary inserts, finishes and retractions."""
    num_pages = 40 // page_size + 1
    cache = KVCacheManager(
        PageAllocator(num_pages, page_size),
        ReqTable(6, 64, torch.device("cpu")),
        RadixCache(page_size),
    )
    live: list[Req] = []
    # few distinct prefixes so that requests share them
    bases = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [5, 5, 5, 5, 5, 5, 5, 5]]
    params = SamplingParams()
    for n, (op, pick, amount) in enumerate(ops):
        if op == "add" and cache.table.num_free:
            req = Req(f"r{n}", 0, bases[pick % 3] + [pick] * amount, params, 0, 0, n)
            cache.admit(req)
            live.append(req)
        elif op == "step" and live:
            req = live[pick % len(live)]
            todo = min(amount, req.seq_len - req.kv_len)
            if todo == 0:
                req.output_ids.append(pick)
                todo = 1
            if cache.alloc(req, todo) is not None:
                req.kv_len += todo
                cache.cache_prefix(req)
        elif op == "decode" and live:
            for req in live:
                req.output_ids.append(pick)
            if cache.alloc_decode(live) is not None:
                for req in live:
                    req.kv_len += 1
                    assert int(cache.table.slots[req.row, req.alloc_len - 1]) == req.last_slot
        elif op in ("finish", "retract") and live:
            req = live.pop(pick % len(live))
            cache.release(req, cache=op == "finish")
        elif op == "evict":
            cache.evict(amount)
        cache.check_integrity(live)
    for req in live:
        cache.release(req, cache=True)
    cache.flush()
    cache.check_integrity([])
    assert cache.allocator.num_free == cache.allocator.capacity

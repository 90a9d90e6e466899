"""Who owns which KV slot: the request→token table, the page allocator and the radix tree."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rt.gpu.kv_pool import PageAllocator, pages_of
from rt.gpu.radix_cache import RadixCache
from rt.gpu.request import Req


class ReqTable:
    """Row r, column i: the KV slot of position i of the request holding row r."""

    def __init__(self, num_rows: int, max_len: int, device: torch.device) -> None:
        self.num_rows = num_rows
        self.slots = torch.zeros(num_rows, max_len, dtype=torch.int64, device=device)
        self._free = list(range(num_rows - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        return self._free.pop()

    def free(self, row: int) -> None:
        self._free.append(row)


class KVCacheManager:
    """Matches prefixes, allocates pages (evicting the tree's LRU leaves first), and returns them.

    Invariant (``check_integrity``): every page but the reserved page 0 is exactly
    one of free, held by the radix tree, or owned by one request.
    """

    def __init__(
        self,
        allocator: PageAllocator,
        table: ReqTable,
        tree: RadixCache,
        enable_prefix_cache: bool = True,
    ) -> None:
        self.allocator = allocator
        self.table = table
        self.tree = tree
        self.page_size = allocator.page_size
        self.enable_prefix_cache = enable_prefix_cache

    @property
    def available_pages(self) -> int:
        """Pages free now or after evicting every unreferenced tree node."""
        return self.allocator.num_free + self.tree.evictable_size // self.page_size

    def pages_needed(self, req: Req, num_tokens: int) -> int:
        ps = self.page_size
        return -(-(req.alloc_len + num_tokens) // ps) - -(-req.alloc_len // ps)

    def admit(self, req: Req) -> int:
        """Give ``req`` a table row and lock its longest cached prefix; return the prefix length."""
        req.row = self.table.alloc()
        tokens = req.token_ids
        prefix_len = 0
        node = self.tree.root
        if self.enable_prefix_cache and not req.computing_prompt_logprobs:
            # keep at least one token to run, so the last position's logits exist
            value, node = self.tree.match_prefix(tokens[: len(tokens) - 1])
            prefix_len = value.shape[0]
            self.table.slots[req.row, :prefix_len] = value
        self.tree.inc_lock(node)
        req.last_node = node
        req.prefix_len = req.kv_len = req.alloc_len = prefix_len
        req.last_slot = int(self.table.slots[req.row, prefix_len - 1]) if prefix_len else -1
        return prefix_len

    def alloc(self, req: Req, num_tokens: int) -> torch.Tensor | None:
        """Slots for positions ``alloc_len .. alloc_len + num_tokens``, or None if the pool cannot hold them."""
        ps, start = self.page_size, req.alloc_len
        need = self.pages_needed(req, num_tokens)
        if need > self.allocator.num_free:
            self.evict(need - self.allocator.num_free)
        pages = self.allocator.alloc(need)
        if pages is None:
            return None
        row = self.table.slots[req.row]
        tail = (-start) % ps  # free slots left in the request's last page
        parts = []
        if tail:
            last = req.last_slot
            parts.append(torch.arange(last + 1, last + 1 + min(tail, num_tokens)))
        if pages:
            page_t = torch.tensor(pages, dtype=torch.int64)
            parts.append((page_t[:, None] * ps + torch.arange(ps)[None, :]).flatten())
        slots = torch.cat(parts)[:num_tokens].to(row.device)
        row[start : start + num_tokens] = slots
        req.alloc_len = start + num_tokens
        if num_tokens:
            req.last_slot = int(slots[-1])
        return slots

    def alloc_decode(self, reqs: list[Req]) -> torch.Tensor | None:
        """One slot for each of ``reqs`` (a decode step), in one table write. None if the pool is short."""
        ps = self.page_size
        fresh = sum(1 for r in reqs if r.alloc_len % ps == 0)
        if fresh > self.allocator.num_free:
            self.evict(fresh - self.allocator.num_free)
        pages = self.allocator.alloc(fresh)
        if pages is None:
            return None
        next_page = iter(pages)
        slots = []
        for r in reqs:
            r.last_slot = next(next_page) * ps if r.alloc_len % ps == 0 else r.last_slot + 1
            slots.append(r.last_slot)
        device = self.table.slots.device
        rows = torch.tensor([r.row for r in reqs], device=device)
        cols = torch.tensor([r.alloc_len for r in reqs], device=device)
        slot_t = torch.tensor(slots, dtype=torch.int64, device=device)
        self.table.slots[rows, cols] = slot_t
        for r in reqs:
            r.alloc_len += 1
        return slot_t

    def evict(self, num_pages: int) -> None:
        self.tree.evict(num_pages * self.page_size, self._free_slots)

    def _free_slots(self, slots: torch.Tensor) -> None:
        self.allocator.free(pages_of(slots, self.page_size))

    def cache_prefix(self, req: Req) -> None:
        """Insert the computed, page-aligned prefix into the tree and re-lock at its end (chunk boundary)."""
        if not self.enable_prefix_cache:
            return
        aligned = req.kv_len - req.kv_len % self.page_size
        if aligned <= req.prefix_len:
            return
        tokens = req.token_ids[:aligned]
        row = self.table.slots[req.row]
        existing = self.tree.insert(tokens, row[:aligned])
        if existing > req.prefix_len:
            # another request cached these tokens first: ours are duplicates
            self._free_slots(row[req.prefix_len : existing])
        value, node = self.tree.match_prefix(tokens)
        assert value.shape[0] == aligned
        row[:aligned] = value
        if req.alloc_len == aligned:
            req.last_slot = int(value[-1])
        self.tree.inc_lock(node)
        assert req.last_node is not None
        self.tree.dec_lock(req.last_node)
        req.last_node, req.prefix_len = node, aligned

    def release(self, req: Req, cache: bool) -> None:
        """Give back everything ``req`` holds; with ``cache`` its computed prefix stays in the tree first."""
        if cache:
            self.cache_prefix(req)
        row = self.table.slots[req.row]
        self._free_slots(row[req.prefix_len : req.alloc_len])
        assert req.last_node is not None
        self.tree.dec_lock(req.last_node)
        self.table.free(req.row)
        req.row, req.last_node = -1, None
        req.prefix_len = req.kv_len = req.alloc_len = 0

    def flush(self) -> None:
        """Drop every unreferenced prefix from the tree."""
        self.tree.evict(self.tree.evictable_size, self._free_slots)

    def check_integrity(self, reqs: Iterable[Req]) -> None:
        """Assert every page is free, held by the tree, or owned by one live request — exactly once."""
        self.tree.check_integrity()
        ps = self.page_size
        owners = [0] * self.allocator.num_pages
        owners[0] = 1
        for page in self.allocator.free_pages():
            owners[page] += 1
        for node in self.tree.nodes():
            expected = (
                node.value[::ps, None] + torch.arange(ps, device=node.value.device)
            ).flatten()
            assert torch.equal(node.value, expected), "a tree node holds a partial page"
            for page in pages_of(node.value, ps):
                owners[page] += 1
        locks: dict[int, int] = {}
        rows: set[int] = set()
        for req in reqs:
            assert req.row not in rows, "two requests share a table row"
            rows.add(req.row)
            assert req.row >= 0 and req.last_node is not None
            assert req.prefix_len % ps == 0 and req.prefix_len <= req.kv_len <= req.alloc_len
            for page in pages_of(self.table.slots[req.row, req.prefix_len : req.alloc_len], ps):
                owners[page] += 1
            node = req.last_node
            while node is not self.tree.root:
                locks[id(node)] = locks.get(id(node), 0) + 1
                assert node.parent is not None
                node = node.parent
        bad = [p for p, n in enumerate(owners) if n != 1]
        assert not bad, f"pages owned {[owners[p] for p in bad[:5]]} times: {bad[:5]}"
        for node in self.tree.nodes():
            assert node.lock_ref == locks.get(id(node), 0), (
                "tree lock counts disagree with live requests"
            )
        assert self.table.num_free + len(rows) == self.table.num_rows, "leaked table rows"

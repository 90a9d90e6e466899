"""A radix tree over token ids whose values are KV slots: shared prefixes, LRU eviction.

Every edge holds a whole number of pages, so matches, splits and evictions
are page-aligned and a page is owned by exactly one node. (Idea from SGLang's
RadixCache; counts of evictable/protected tokens as in mini-sglang.)
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence

import torch


class TreeNode:
    __slots__ = ("children", "key", "last_access", "lock_ref", "parent", "value")

    def __init__(self, key: list[int], value: torch.Tensor, parent: TreeNode | None) -> None:
        self.key = key
        self.value = value  # [len(key)] int64 slots
        self.parent = parent
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.lock_ref = 0
        self.last_access = 0


class RadixCache:
    """Token-id prefixes → KV slots, with reference counts while a request uses a path."""

    def __init__(self, page_size: int, device: torch.device | str = "cpu") -> None:
        self.page_size = page_size
        self.device = torch.device(device)
        self._clock = itertools.count(1)
        self.reset()

    def reset(self) -> None:
        self.root = TreeNode([], torch.empty(0, dtype=torch.int64, device=self.device), None)
        self.root.lock_ref = 1
        self.evictable_size = 0
        self.protected_size = 0

    def _edge(self, key: Sequence[int], start: int = 0) -> tuple[int, ...]:
        return tuple(key[start : start + self.page_size])

    def _common_len(self, a: Sequence[int], b: Sequence[int], start: int) -> int:
        n = min(len(a), len(b) - start)
        i = 0
        while i < n and a[i] == b[start + i]:
            i += 1
        return i - i % self.page_size

    def match_prefix(self, key: Sequence[int]) -> tuple[torch.Tensor, TreeNode]:
        """Longest cached page-aligned prefix of ``key``: its slots and the node that ends it."""
        node, pos, parts = self.root, 0, []
        now = next(self._clock)
        node.last_access = now
        while len(key) - pos >= self.page_size:
            child = node.children.get(self._edge(key, pos))
            if child is None:
                break
            n = self._common_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            parts.append(child.value)
            pos += n
            node = child
        value = torch.cat(parts) if parts else self.root.value
        return value, node

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key)
        mid = TreeNode(child.key[:n], child.value[:n], parent)
        mid.lock_ref = child.lock_ref
        mid.last_access = child.last_access
        parent.children[self._edge(mid.key)] = mid
        child.key, child.value, child.parent = child.key[n:], child.value[n:], mid
        mid.children[self._edge(child.key)] = child
        return mid

    def insert(self, key: Sequence[int], value: torch.Tensor) -> int:
        """Insert a page-aligned ``key`` → ``value``; return how many leading tokens were already cached.

        The caller still owns (and must free) its slots for those leading tokens.
        """
        assert len(key) % self.page_size == 0 and len(key) == value.shape[0]
        node, pos = self.root, 0
        now = next(self._clock)
        while pos < len(key):
            child = node.children.get(self._edge(key, pos))
            if child is None:
                new = TreeNode(list(key[pos:]), value[pos:].clone(), node)
                new.last_access = now
                node.children[self._edge(new.key)] = new
                self.evictable_size += len(new.key)
                return pos
            n = self._common_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            pos += n
            node = child
        return pos

    def inc_lock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def dec_lock(self, node: TreeNode) -> None:
        while node is not self.root:
            assert node.lock_ref > 0, "unbalanced dec_lock"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            assert node.parent is not None
            node = node.parent

    def evict(self, num_tokens: int, free: Callable[[torch.Tensor], None]) -> int:
        """Free unreferenced leaves, least recently used first, until ``num_tokens`` are freed."""
        heap = [
            (n.last_access, id(n), n) for n in self.nodes() if not n.children and n.lock_ref == 0
        ]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            free(leaf.value)
            freed += len(leaf.key)
            self.evictable_size -= len(leaf.key)
            del parent.children[self._edge(leaf.key)]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    def nodes(self) -> Iterator[TreeNode]:
        """Every node but the root."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def check_integrity(self) -> None:
        evictable = protected = 0
        for node in self.nodes():
            assert node.parent is not None and node.parent.children[self._edge(node.key)] is node
            assert len(node.key) == node.value.shape[0] and len(node.key) % self.page_size == 0
            assert node.key, "empty edge"
            assert node.lock_ref >= sum(c.lock_ref for c in node.children.values())
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        assert (evictable, protected) == (self.evictable_size, self.protected_size)

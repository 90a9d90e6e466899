"""The token-slot pool: KV buffers per layer, handed out in pages of ``page_size`` slots."""

from __future__ import annotations

import torch

from rt.errors import ConfigError


class KVPool:
    """K and V buffers, seen as [num_layers, num_kv_heads, num_slots, head_dim].

    Heads before slots in memory (the default): a gather by slot gives each
    head a contiguous [tokens, head_dim] block, which CPU SDPA runs ~25% faster
    on. With ``slots_major`` the memory is [num_layers, num_slots, num_kv_heads,
    head_dim] and ``k``/``v`` are transposed views of it: the layout paged
    kernels such as flashinfer's read as pages (:meth:`pages`). Kernels take
    strides, so they read either.

    Slot ``s`` belongs to page ``s // page_size``. Slot 0 .. page_size-1 (page 0)
    is never handed out: padded attention reads it, so it must stay finite.
    """

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        slots_major: bool = False,
    ) -> None:
        if num_pages < 2:
            raise ConfigError(f"the KV pool needs at least 2 pages, got {num_pages}")
        self.page_size = page_size
        self.num_pages = num_pages
        self.slots_major = slots_major
        num_slots = num_pages * page_size
        if slots_major:
            shape = (num_layers, num_slots, num_kv_heads, head_dim)
            self.k = torch.zeros(shape, dtype=dtype, device=device).transpose(1, 2)
            self.v = torch.zeros(shape, dtype=dtype, device=device).transpose(1, 2)
        else:
            shape = (num_layers, num_kv_heads, num_slots, head_dim)
            self.k = torch.zeros(shape, dtype=dtype, device=device)
            self.v = torch.zeros(shape, dtype=dtype, device=device)

    def pages(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer_id``'s K and V as [num_pages, page_size, num_kv_heads, head_dim]
        (flashinfer's "NHD" paged layout): views, so writes land in the pool."""
        if not self.slots_major:
            raise ConfigError("KVPool.pages needs a slots_major pool")
        _, num_kv_heads, _, head_dim = self.k.shape
        shape = (self.num_pages, self.page_size, num_kv_heads, head_dim)
        return (
            self.k[layer_id].transpose(0, 1).view(shape),
            self.v[layer_id].transpose(0, 1).view(shape),
        )

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


class PageAllocator:
    """Free list of pages. Page 0 is reserved (see KVPool)."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        self._free: list[int] = []
        self.reset()

    def reset(self) -> None:
        # popped from the end: low page ids first, which keeps runs deterministic
        self._free = list(range(self.num_pages - 1, 0, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def capacity(self) -> int:
        """Pages that can ever be handed out."""
        return self.num_pages - 1

    def alloc(self, num_pages: int) -> list[int] | None:
        if num_pages > len(self._free):
            return None
        if num_pages == 0:
            return []
        pages = self._free[-num_pages:]
        del self._free[-num_pages:]
        pages.reverse()
        return pages

    def free(self, pages: list[int]) -> None:
        self._free.extend(pages)

    def free_pages(self) -> list[int]:
        return list(self._free)


def pages_of(slots: torch.Tensor, page_size: int) -> list[int]:
    """The distinct pages holding ``slots`` (in first-seen order)."""
    if slots.numel() == 0:
        return []
    pages = (slots // page_size).tolist()
    return list(dict.fromkeys(pages))

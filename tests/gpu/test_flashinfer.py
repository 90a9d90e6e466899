"""flashinfer attention against the torch reference, on one shared slots-major pool.

The CUDA tests need a GPU and flashinfer-python; the page-table, window and
start-up checks run everywhere.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import torch

from rt.errors import ConfigError
from rt.gpu.attention.flashinfer_backend import FlashInferAttention, page_table, window_left
from rt.gpu.attention.torch_backend import TorchAttention
from rt.gpu.forward_batch import ForwardBatch
from rt.gpu.kv_pool import KVPool

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def make_requests(
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    page_size: int,
    num_pages: int,
    device: torch.device | str,
    seed: int = 0,
) -> tuple[torch.Tensor, ForwardBatch]:
    """A request→token table whose rows own shuffled whole pages, and the batch extending them.

    Rows are handed out in reverse so ``req_rows`` is not the identity.
    """
    rng = random.Random(seed)
    free = list(range(1, num_pages))  # page 0 is reserved
    rng.shuffle(free)
    bs = len(prefix_lens)
    max_len = max(p + e for p, e in zip(prefix_lens, extend_lens, strict=True))
    table = torch.zeros(bs + 1, max_len, dtype=torch.int64)
    rows = list(range(bs, 0, -1))
    out_loc = []
    for row, prefix, extend in zip(rows, prefix_lens, extend_lens, strict=True):
        seq_len = prefix + extend
        pages = [free.pop() for _ in range((seq_len + page_size - 1) // page_size)]
        slots = torch.tensor(
            [pages[pos // page_size] * page_size + pos % page_size for pos in range(seq_len)]
        )
        table[row, :seq_len] = slots
        out_loc.append(slots[prefix:])
    num_tokens = sum(extend_lens)
    positions = torch.cat(
        [torch.arange(p, p + e) for p, e in zip(prefix_lens, extend_lens, strict=True)]
    )
    batch = ForwardBatch(
        input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=device),
        positions=positions.to(device),
        out_cache_loc=torch.cat(out_loc).to(device),
        req_rows=torch.tensor(rows, dtype=torch.int64, device=device),
        prefix_lens=list(prefix_lens),
        extend_lens=list(extend_lens),
        sample_indices=torch.zeros(0, dtype=torch.int64, device=device),
    )
    return table.to(device), batch


# --- everywhere -------------------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_page_table_matches_a_per_position_walk(page_size: int) -> None:
    seq_lens = [1, 5, 16, 17, 33, 4]
    num_pages = sum((n + page_size - 1) // page_size for n in seq_lens) + 3
    table, batch = make_requests([0] * 6, seq_lens, page_size, num_pages, "cpu", seed=7)
    kv_indptr, kv_indices, last_page_len = page_table(table, batch.req_rows, seq_lens, page_size)
    assert kv_indptr.dtype == kv_indices.dtype == last_page_len.dtype == torch.int32
    for b, (row, n) in enumerate(zip(batch.req_rows.tolist(), seq_lens, strict=True)):
        pages = kv_indices[kv_indptr[b] : kv_indptr[b + 1]].tolist()
        slots = [p * page_size + i for p in pages for i in range(page_size)]
        assert 1 <= last_page_len[b] <= page_size
        assert len(slots) - page_size + int(last_page_len[b]) == n
        assert slots[:n] == table[row, :n].tolist()


@pytest.mark.parametrize("window", [1, 3, 8])
def test_window_left_keeps_the_same_keys_as_the_reference(window: int) -> None:
    kv_len, qo_len = 12, 5
    qo_idx = torch.arange(qo_len)[:, None]
    kv_idx = torch.arange(kv_len)[None, :]
    q_pos = kv_len - qo_len + qo_idx
    # flashinfer's sliding-window predicate (include/flashinfer/attention/variants.cuh)
    theirs = kv_idx + qo_len + window_left(window) >= kv_len + qo_idx
    ours = kv_idx > q_pos - window  # torch_backend
    causal = kv_idx <= q_pos
    assert torch.equal(theirs & causal, ours & causal)
    assert window_left(None) == -1


def test_refuses_a_cpu_pool() -> None:
    pool = KVPool(4, 16, 2, 2, 64, torch.float32, "cpu", slots_major=True)
    table = torch.zeros(2, 64, dtype=torch.int64)
    with pytest.raises(ConfigError, match=r"needs CUDA and the flashinfer-python package"):
        FlashInferAttention(pool, table, [None, None])


def test_refuses_a_heads_major_pool() -> None:
    pool = KVPool(4, 16, 2, 2, 64, torch.float32, "cpu")
    table = torch.zeros(2, 64, dtype=torch.int64)
    with pytest.raises(ConfigError, match=r"needs a slots_major KV pool"):
        FlashInferAttention(pool, table, [None, None])


# --- CUDA + flashinfer --------------------------------------------------------

WINDOWS: list[int | None] = [None, 6, None]  # one sliding-window layer between full ones
HEAD_DIM = 128


def run_both(
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    page_size: int,
    num_heads: int,
    num_kv_heads: int,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every layer's output from flashinfer, then from torch, over one shared pool."""
    pytest.importorskip("flashinfer")
    device = torch.device("cuda")
    torch.manual_seed(0)
    seq_total = sum(p + e for p, e in zip(prefix_lens, extend_lens, strict=True))
    num_pages = seq_total // page_size + len(prefix_lens) + 4
    pool = KVPool(
        num_pages,
        page_size,
        len(WINDOWS),
        num_kv_heads,
        HEAD_DIM,
        torch.bfloat16,
        device,
        slots_major=True,
    )
    pool.k.normal_()
    pool.v.normal_()  # stands in for the prefixes' K/V (and keeps stale slots finite)
    table, batch = make_requests(prefix_lens, extend_lens, page_size, num_pages, device)
    n = sum(extend_lens)
    qkv = [
        (
            torch.randn(n, num_heads, HEAD_DIM, device=device, dtype=torch.bfloat16),
            torch.randn(n, num_kv_heads, HEAD_DIM, device=device, dtype=torch.bfloat16),
            torch.randn(n, num_kv_heads, HEAD_DIM, device=device, dtype=torch.bfloat16),
        )
        for _ in WINDOWS
    ]
    outs = []
    for backend in (
        FlashInferAttention(pool, table, WINDOWS),
        TorchAttention(pool, table, WINDOWS),
    ):
        backend.prepare(batch)
        outs.append([backend.forward(i, *qkv[i]) for i in range(len(WINDOWS))])
    return outs[0], outs[1]


GQA = pytest.mark.parametrize(
    ("num_heads", "num_kv_heads"), [(8, 2), (8, 8), (4, 1)], ids=["gqa4", "mha", "mqa"]
)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("page_size", [1, 16])
@GQA
def test_decode_matches_torch(page_size: int, num_heads: int, num_kv_heads: int) -> None:
    seq_lens = [1, 7, 16, 17, 40, 100]
    ours, ref = run_both(
        [n - 1 for n in seq_lens], [1] * len(seq_lens), page_size, num_heads, num_kv_heads
    )
    for layer, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert a.shape == b.shape == (len(seq_lens), num_heads * HEAD_DIM)
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2, msg=f"layer {layer}")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("page_size", [1, 16])
@GQA
def test_extend_with_prefixes_matches_torch(
    page_size: int, num_heads: int, num_kv_heads: int
) -> None:
    # fresh prompts, prompts on a cached prefix (page-aligned and not), and a
    # one-token extend mixed in, which keeps the batch on the prefill path
    prefix_lens = [0, 0, 16, 5, 32, 9]
    extend_lens = [1, 23, 16, 12, 3, 1]
    ours, ref = run_both(prefix_lens, extend_lens, page_size, num_heads, num_kv_heads)
    for layer, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert a.shape == b.shape == (sum(extend_lens), num_heads * HEAD_DIM)
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2, msg=f"layer {layer}")


@pytest.mark.gpu
@needs_cuda
def test_writes_new_kv_at_out_cache_loc() -> None:
    pytest.importorskip("flashinfer")
    device = torch.device("cuda")
    pool = KVPool(8, 4, 1, 2, HEAD_DIM, torch.bfloat16, device, slots_major=True)
    table, batch = make_requests([3], [2], 4, 8, device)
    attn = FlashInferAttention(pool, table, [None])
    k = torch.randn(2, 2, HEAD_DIM, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    attn.prepare(batch)
    attn.forward(0, torch.randn(2, 4, HEAD_DIM, device=device, dtype=torch.bfloat16), k, v)
    slots = batch.out_cache_loc
    torch.testing.assert_close(pool.k[0][:, slots].transpose(0, 1), k, atol=0, rtol=0)
    torch.testing.assert_close(pool.v[0][:, slots].transpose(0, 1), v, atol=0, rtol=0)

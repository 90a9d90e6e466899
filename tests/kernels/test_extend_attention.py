from __future__ import annotations

import math

import pytest
import torch

from kernels import device_type
from kernels.extend_attention import extend_attention, extend_attention_ref
from rt.gpu.attention.torch_backend import TorchAttention
from rt.gpu.forward_batch import ForwardBatch
from rt.gpu.kv_pool import KVPool

# (prefix_len, extend_len): fresh prompts of 1, 7 and 33 tokens, a chunk after a
# cached prefix, and a decode step
SEQS = [(0, 1), (0, 7), (0, 33), (20, 5), (40, 1)]
MAX_CONTEXT = 64
DEVICE = torch.device(device_type())
# (atol, rtol) against a float32-softmax reference
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (2e-2, 1e-2),
    torch.float16: (2e-3, 1e-3),
}
T = torch.Tensor
Args = tuple[T, T, T, T, T, T, T]  # q, k_buf, v_buf, req_to_token, req_rows, prefix/extend_lens


def _slot_table(
    seqs: list[tuple[int, int]], page_size: int, index_dtype: torch.dtype, fill: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """req_to_token [len(seqs) + 2, MAX_CONTEXT] over shuffled pages (page 0 never used),
    the requests' rows (shuffled, two rows unused) and the pool's slot count."""
    gen = torch.Generator().manual_seed(seed)
    pages_per_req = [math.ceil((p + e) / page_size) for p, e in seqs]
    num_pages = sum(pages_per_req) + 3
    pages = 1 + torch.randperm(num_pages - 1, generator=gen)
    table = torch.full((len(seqs) + 2, MAX_CONTEXT), fill, dtype=torch.int64)
    rows = torch.randperm(len(seqs) + 2, generator=gen)[: len(seqs)]
    first = 0
    for row, (prefix_len, extend_len), n in zip(rows.tolist(), seqs, pages_per_req, strict=True):
        req_pages = pages[first : first + n]
        first += n
        slots = (req_pages[:, None] * page_size + torch.arange(page_size)).flatten()
        table[row, : prefix_len + extend_len] = slots[: prefix_len + extend_len]
    return table.to(index_dtype), rows, num_pages * page_size


def _batch(
    seqs: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    page_size: int = 16,
    transposed: bool = False,
    index_dtype: torch.dtype = torch.int64,
    seed: int = 0,
) -> Args:
    """(q, k_buf, v_buf, req_to_token, req_rows, prefix_lens, extend_lens) with random data.

    Table entries past each sequence hold an out-of-range slot: the kernel must not read them.
    """
    table, rows, num_slots = _slot_table(seqs, page_size, index_dtype, 10**6, seed)
    torch.manual_seed(seed)
    if transposed:  # a [num_slots, num_kv_heads, head_dim] pool viewed head-major
        k_buf, v_buf = (
            torch.randn(num_slots, num_kv_heads, head_dim).to(DEVICE, dtype).transpose(0, 1)
            for _ in range(2)
        )
    else:
        k_buf, v_buf = (
            torch.randn(num_kv_heads, num_slots, head_dim).to(DEVICE, dtype) for _ in range(2)
        )
    q = torch.randn(sum(e for _, e in seqs), num_heads, head_dim).to(DEVICE, dtype)
    prefix_lens = torch.tensor([p for p, _ in seqs], dtype=index_dtype, device=DEVICE)
    extend_lens = torch.tensor([e for _, e in seqs], dtype=index_dtype, device=DEVICE)
    return q, k_buf, v_buf, table.to(DEVICE), rows.to(DEVICE, index_dtype), prefix_lens, extend_lens


@pytest.mark.parametrize(
    ("head_dim", "num_kv_heads", "window", "dtype", "page_size", "transposed", "index_dtype",
     "block_n"),
    [
        (32, 2, None, torch.float32, 1, False, torch.int32, None),
        (48, 1, 12, torch.float32, 16, True, torch.int64, 16),
        (64, 2, 12, torch.bfloat16, 16, False, torch.int32, None),
        (48, 2, None, torch.bfloat16, 1, True, torch.int64, 16),
        (64, 1, None, torch.float32, 16, False, torch.int64, 16),
        (32, 1, 12, torch.bfloat16, 16, True, torch.int32, 16),
        (64, 2, 12, torch.float16, 1, False, torch.int64, None),
    ],
)  # fmt: skip
def test_extend_attention_matches_reference(
    head_dim: int,
    num_kv_heads: int,
    window: int | None,
    dtype: torch.dtype,
    page_size: int,
    transposed: bool,
    index_dtype: torch.dtype,
    block_n: int | None,
) -> None:
    args = _batch(SEQS, 4, num_kv_heads, head_dim, dtype, page_size, transposed, index_dtype)
    scale = head_dim**-0.5
    out = extend_attention(*args, scale, window, block_n=block_n)
    ref = extend_attention_ref(*args, scale, window)
    assert out.dtype == dtype
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize(("dtype", "window"), [(torch.float32, None), (torch.bfloat16, 12)])
def test_extend_attention_matches_torch_backend(dtype: torch.dtype, window: int | None) -> None:
    """Against the engine's reference on a real KVPool and ForwardBatch."""
    num_heads, num_kv_heads, head_dim, page_size = 4, 2, 32, 16
    table, rows, num_slots = _slot_table(SEQS, page_size, torch.int64, 0, seed=1)
    table, rows = table.to(DEVICE), rows.to(DEVICE)
    pool = KVPool(num_slots // page_size, page_size, 1, num_kv_heads, head_dim, dtype, DEVICE)
    torch.manual_seed(1)
    pool.k.copy_(torch.randn(pool.k.shape))
    pool.v.copy_(torch.randn(pool.v.shape))
    positions = torch.cat([torch.arange(p, p + e) for p, e in SEQS]).to(DEVICE)
    out_cache_loc = torch.cat(
        [table[row, p : p + e] for row, (p, e) in zip(rows.tolist(), SEQS, strict=True)]
    )
    batch = ForwardBatch(
        input_ids=torch.zeros_like(positions),
        positions=positions,
        out_cache_loc=out_cache_loc,
        req_rows=rows,
        prefix_lens=[p for p, _ in SEQS],
        extend_lens=[e for _, e in SEQS],
        sample_indices=torch.cumsum(torch.tensor([e for _, e in SEQS], device=DEVICE), 0) - 1,
    )
    q = torch.randn(len(positions), num_heads, head_dim).to(DEVICE, dtype)
    k, v = (torch.randn(len(positions), num_kv_heads, head_dim).to(DEVICE, dtype) for _ in range(2))
    backend = TorchAttention(pool, table, [window])
    backend.prepare(batch)
    expected = backend.forward(0, q, k, v)  # stores k, v into the pool first

    out = extend_attention(
        q,
        pool.k[0],
        pool.v[0],
        table,
        rows,
        torch.tensor(batch.prefix_lens, device=DEVICE),
        torch.tensor(batch.extend_lens, device=DEVICE),
        head_dim**-0.5,
        window,
    )
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out.flatten(1), expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize(
    ("window", "blocks"), [(None, (16, 16)), (12, (None, None))], ids=["16x16", "default"]
)
def test_extend_attention_is_batch_invariant(
    window: int | None, blocks: tuple[int | None, int | None]
) -> None:
    """Request A's rows are bit-identical alone and among requests of other lengths."""
    seqs = [(3, 30), (0, 5), (20, 17), (40, 1)]  # A is the request at index 2
    q, k_buf, v_buf, table, rows, prefix_lens, extend_lens = _batch(
        seqs, 2, 1, 32, torch.float32, page_size=1
    )
    block_m, block_n = blocks
    batched = extend_attention(
        q, k_buf, v_buf, table, rows, prefix_lens, extend_lens, 0.2, window,
        block_m=block_m, block_n=block_n,
    )  # fmt: skip
    a, start = 2, 35
    alone = extend_attention(
        q[start : start + 17], k_buf, v_buf, table, rows[a:a + 1], prefix_lens[a:a + 1],
        extend_lens[a:a + 1], 0.2, window,
        q_starts=torch.zeros(2, dtype=torch.int64, device=DEVICE),
        max_extend_len=48,  # an oversized grid
        block_m=block_m, block_n=block_n,
    )  # fmt: skip
    assert torch.equal(alone, batched[start : start + 17])


@pytest.mark.parametrize(
    ("window", "prefix_len", "blocks"),
    [(None, 0, (16, 16)), (12, 27, (16, 16)), (None, 27, (None, None)), (12, 0, (None, None))],
)
def test_extend_attention_is_prefix_invariant(
    window: int | None, prefix_len: int, blocks: tuple[int | None, int | None]
) -> None:
    """10 tokens as one extend, or as an extend of 6 then one of 4: bit-identical rows."""
    q, k_buf, v_buf, table, rows, _, _ = _batch(
        [(prefix_len, 10)], 2, 1, 48, torch.float32, page_size=16
    )
    block_m, block_n = blocks

    def extend(rows_q: slice, prefix: int) -> torch.Tensor:
        q_part = q[rows_q]
        return extend_attention(
            q_part, k_buf, v_buf, table, rows, torch.tensor([prefix], device=DEVICE),
            torch.tensor([q_part.shape[0]], device=DEVICE), 0.15, window,
            block_m=block_m, block_n=block_n,
        )  # fmt: skip

    whole = extend(slice(0, 10), prefix_len)
    chunked = torch.cat([extend(slice(0, 6), prefix_len), extend(slice(6, 10), prefix_len + 6)])
    assert torch.equal(whole, chunked)


def test_extend_attention_empty_batch() -> None:
    q, k_buf, v_buf, table, _, _, _ = _batch([(0, 1)], 4, 2, 32, torch.float32)
    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    out = extend_attention(q[:0], k_buf, v_buf, table, empty, empty, empty, 0.1)
    assert out.shape == (0, 4, 32)


def test_extend_attention_rejects_bad_inputs() -> None:
    q, k_buf, v_buf, table, rows, prefix_lens, extend_lens = _batch(
        [(0, 3), (2, 2)], 4, 2, 32, torch.float32
    )
    lens = (table, rows, prefix_lens, extend_lens, 0.1)
    with pytest.raises(ValueError, match="must share one dtype"):
        extend_attention(q.half(), k_buf, v_buf, *lens)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        extend_attention(q[:, :3], k_buf, v_buf, *lens)
    with pytest.raises(ValueError, match="head_dim axis"):
        extend_attention(q.transpose(1, 2).contiguous().transpose(1, 2), k_buf, v_buf, *lens)
    with pytest.raises(ValueError, match=r"prefix_lens must be int32/int64 \[\d+\]"):
        extend_attention(q, k_buf, v_buf, table, rows, prefix_lens[:1], extend_lens, 0.1)
    with pytest.raises(ValueError, match="extend_lens sum to 5 but q has 4"):
        extend_attention(q[:4], k_buf, v_buf, *lens)
    with pytest.raises(ValueError, match="window must be None or at least 1"):
        extend_attention(q, k_buf, v_buf, *lens, 0)
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        extend_attention(q, k_buf, v_buf, *lens, block_n=24)

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from kernels.decode_attention import decode_attention, decode_attention_ref
from kernels.kv_store import store_kv
from rt.gpu.attention.torch_backend import TorchAttention
from rt.gpu.forward_batch import ForwardBatch
from rt.gpu.kv_pool import KVPool

SEQ_LENS = (1, 5, 37, 300)
SPLIT_SIZE = 64  # several splits for the 300-token request, but few programs (interpreter)
POISON = 100.0  # K/V of slot 0, which every unused req_to_token entry points at
# the kernels run natively on CUDA tensors, under the interpreter on CPU ones
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}  # atol, rtol


@dataclass
class Case:
    q: torch.Tensor  # [bs, num_heads, head_dim]
    k_buf: torch.Tensor  # [num_kv_heads, num_slots, head_dim]
    v_buf: torch.Tensor
    req_to_token: torch.Tensor  # [max_reqs, max_context]
    req_rows: torch.Tensor  # [bs]
    seq_lens: torch.Tensor  # [bs]


def _make_case(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    page_size: int,
    *,
    index_dtype: torch.dtype = torch.int64,
    pool_transposed: bool = False,
    seq_lens: tuple[int, ...] = SEQ_LENS,
) -> Case:
    """A random pool whose requests own shuffled pages; page 0 is poison, never owned."""
    pages_per_req = [-(-n // page_size) for n in seq_lens]
    num_pages = 1 + sum(pages_per_req) + 3
    num_slots = num_pages * page_size
    shape = (
        (num_slots, num_kv_heads, head_dim)
        if pool_transposed
        else (num_kv_heads, num_slots, head_dim)
    )
    k_buf, v_buf = (torch.randn(shape, device=DEVICE).to(dtype) for _ in range(2))
    if pool_transposed:  # [S, H, D] storage seen as [H, S, D]
        k_buf, v_buf = k_buf.transpose(0, 1), v_buf.transpose(0, 1)
    k_buf[:, :page_size] = POISON
    v_buf[:, :page_size] = POISON

    bs, max_context = len(seq_lens), max(seq_lens) + 7
    req_rows = torch.randperm(bs + 2)[:bs]  # rows not in batch order, some rows unused
    req_to_token = torch.zeros(bs + 2, max_context, dtype=index_dtype)
    pages = (torch.randperm(num_pages - 1) + 1).tolist()
    for row, n, n_pages in zip(req_rows.tolist(), seq_lens, pages_per_req, strict=True):
        owned = torch.tensor(pages[:n_pages])
        del pages[:n_pages]
        slots = (owned[:, None] * page_size + torch.arange(page_size)).flatten()
        req_to_token[row, :n] = slots[:n].to(index_dtype)
    q = torch.randn(bs, num_heads, head_dim, device=DEVICE).to(dtype)
    seq_lens_t = torch.tensor(seq_lens, device=DEVICE)
    return Case(q, k_buf, v_buf, req_to_token.to(DEVICE), req_rows.to(DEVICE), seq_lens_t)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "window", "dtype", "page_size"),
    [
        (2, 2, 32, None, torch.float32, 1),  # MHA
        (4, 2, 48, 12, torch.float32, 16),  # GQA, non-power-of-two head_dim
        (4, 1, 64, None, torch.bfloat16, 16),  # MQA
        (4, 2, 64, 12, torch.bfloat16, 1),
        (4, 1, 48, 12, torch.float32, 1),
        (2, 2, 48, None, torch.bfloat16, 16),
    ],
)
def test_decode_attention_matches_reference(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    window: int | None,
    dtype: torch.dtype,
    page_size: int,
) -> None:
    torch.manual_seed(num_heads * 1000 + head_dim * 10 + page_size)
    # vary the layouts with the case: int32/int64 table, [S, H, D] pool view
    case = _make_case(
        num_heads,
        num_kv_heads,
        head_dim,
        dtype,
        page_size,
        index_dtype=torch.int32 if page_size == 1 else torch.int64,
        pool_transposed=window is None,
    )
    scale = head_dim**-0.5
    args = (case.q, case.k_buf, case.v_buf, case.req_to_token, case.req_rows, case.seq_lens)

    out = decode_attention(*args, scale, window, split_size=SPLIT_SIZE)
    ref = decode_attention_ref(*args, scale, window)

    assert out.dtype == dtype and out.shape == case.q.shape
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


def test_decode_attention_non_contiguous_q_and_out() -> None:
    torch.manual_seed(1)
    case = _make_case(4, 2, 32, torch.float32, 16, seq_lens=(70, 3))
    qkv = torch.randn(2, 4 + 2 * 2, 32, device=DEVICE)
    q = qkv[:, :4]  # a slice of a fused qkv projection: strides (256, 32, 1)
    out_storage = torch.full((2, 8, 32), float("nan"), device=DEVICE)
    out = out_storage[:, ::2]
    args = (case.k_buf, case.v_buf, case.req_to_token, case.req_rows, case.seq_lens)

    result = decode_attention(q, *args, 0.2, split_size=32, out=out)

    assert result is out
    torch.testing.assert_close(out, decode_attention_ref(q, *args, 0.2), atol=1e-5, rtol=1e-5)
    assert out_storage[:, 1::2].isnan().all()  # the rows between were not written


def test_extra_splits_change_nothing() -> None:
    """A fixed grid (CUDA graphs) larger than the batch needs gives the same result."""
    torch.manual_seed(2)
    case = _make_case(4, 2, 32, torch.float32, 16, seq_lens=(40, 1, 75))
    args = (case.q, case.k_buf, case.v_buf, case.req_to_token, case.req_rows, case.seq_lens)

    needed = decode_attention(*args, 0.3, 16, split_size=32)  # 3 splits
    fixed = decode_attention(*args, 0.3, 16, split_size=32, num_splits=6)

    torch.testing.assert_close(fixed, needed, atol=0, rtol=0)
    ref = decode_attention_ref(*args, 0.3, 16)
    torch.testing.assert_close(needed, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 12])
def test_matches_torch_backend_decode(window: int | None) -> None:
    """The engine's reference backend, on a decode batch: store the new token, then attend."""
    torch.manual_seed(3)
    num_heads, num_kv_heads, head_dim, page_size = 4, 2, 32, 4
    seq_lens = [9, 1, 50]
    pool = KVPool(32, page_size, 1, num_kv_heads, head_dim, torch.float32, DEVICE)
    pool.k.normal_()
    pool.v.normal_()
    req_to_token = torch.zeros(4, 64, dtype=torch.int32)
    req_rows = torch.tensor([3, 0, 1])
    next_page = 1
    for row, n in zip(req_rows.tolist(), seq_lens, strict=True):
        n_pages = -(-n // page_size)
        slots = torch.arange(next_page * page_size, (next_page + n_pages) * page_size)
        req_to_token[row, :n] = slots[:n].int()
        next_page += n_pages
    req_to_token, req_rows = req_to_token.to(DEVICE), req_rows.to(DEVICE)
    seq_lens_t = torch.tensor(seq_lens, device=DEVICE)
    out_loc = req_to_token[req_rows, seq_lens_t - 1].long()
    bs = len(seq_lens)
    batch = ForwardBatch(
        input_ids=torch.zeros(bs, dtype=torch.int64, device=DEVICE),
        positions=seq_lens_t - 1,
        out_cache_loc=out_loc,
        req_rows=req_rows,
        prefix_lens=[n - 1 for n in seq_lens],
        extend_lens=[1] * bs,
        sample_indices=torch.arange(bs, device=DEVICE),
    )
    q = torch.randn(bs, num_heads, head_dim, device=DEVICE)
    k, v = (torch.randn(bs, num_kv_heads, head_dim, device=DEVICE) for _ in range(2))
    k_buf, v_buf = pool.k[0].clone(), pool.v[0].clone()

    backend = TorchAttention(pool, req_to_token, [window])
    backend.prepare(batch)
    expected = backend.forward(0, q, k, v)  # [bs, num_heads * head_dim]

    store_kv(k_buf, v_buf, k, v, out_loc)
    out = decode_attention(
        q,
        k_buf,
        v_buf,
        req_to_token,
        req_rows,
        seq_lens_t,
        head_dim**-0.5,
        window,
        split_size=32,
    )

    assert torch.equal(k_buf, pool.k[0]) and torch.equal(v_buf, pool.v[0])
    torch.testing.assert_close(out.view(bs, -1), expected, atol=1e-5, rtol=1e-5)


def test_decode_attention_rejects_bad_inputs() -> None:
    case = _make_case(4, 2, 32, torch.float32, 1, seq_lens=(3, 2))
    q, k_buf, v_buf = case.q, case.k_buf, case.v_buf
    index = (case.req_to_token, case.req_rows, case.seq_lens)
    with pytest.raises(ValueError, match="must be a multiple of num_kv_heads"):
        decode_attention(q[:, :3], k_buf, v_buf, *index, 1.0)
    with pytest.raises(ValueError, match="q has head_dim 16, the pool 32"):
        decode_attention(q[..., :16].contiguous(), k_buf, v_buf, *index, 1.0)
    with pytest.raises(ValueError, match="share one dtype"):
        decode_attention(q.bfloat16(), k_buf, v_buf, *index, 1.0)
    with pytest.raises(ValueError, match="req_to_token must be a 2-D int32/int64"):
        decode_attention(q, k_buf, v_buf, case.req_to_token.float(), *index[1:], 1.0)
    with pytest.raises(ValueError, match=r"seq_lens must be int32/int64 \[2\]"):
        decode_attention(q, k_buf, v_buf, *index[:2], case.seq_lens[:1], 1.0)
    with pytest.raises(ValueError, match="must have stride 1"):
        decode_attention(q.transpose(1, 2).contiguous().transpose(1, 2), k_buf, v_buf, *index, 1.0)
    with pytest.raises(ValueError, match="split_size must be a positive multiple of 32"):
        decode_attention(q, k_buf, v_buf, *index, 1.0, split_size=48)
    with pytest.raises(ValueError, match="window must be None or at least 1"):
        decode_attention(q, k_buf, v_buf, *index, 1.0, 0)

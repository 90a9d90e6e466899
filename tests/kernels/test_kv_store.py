from __future__ import annotations

import pytest
import torch

from kernels.kv_store import store_kv, store_kv_ref

NUM_SLOTS = 40
# the kernels run natively on CUDA tensors, under the interpreter on CPU ones
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _buffers(
    num_kv_heads: int, head_dim: int, dtype: torch.dtype, transposed: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random k_buf, v_buf [num_kv_heads, NUM_SLOTS, head_dim]; transposed: a view of [S, H, D]."""
    shape = (
        (NUM_SLOTS, num_kv_heads, head_dim) if transposed else (num_kv_heads, NUM_SLOTS, head_dim)
    )
    k_buf, v_buf = (torch.randn(shape, device=DEVICE).to(dtype) for _ in range(2))
    if transposed:
        return k_buf.transpose(0, 1), v_buf.transpose(0, 1)
    return k_buf, v_buf


@pytest.mark.parametrize("transposed", [False, True], ids=["hsd", "shd_view"])
@pytest.mark.parametrize(
    ("num_tokens", "num_kv_heads", "head_dim", "dtype"),
    [
        (1, 1, 32, torch.float32),
        (7, 3, 48, torch.bfloat16),
        (33, 2, 64, torch.float16),
        (7, 2, 80, torch.float32),
    ],
)
def test_store_kv_matches_reference(
    num_tokens: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, transposed: bool
) -> None:
    torch.manual_seed(num_tokens * 100 + head_dim)
    k_buf, v_buf = _buffers(num_kv_heads, head_dim, dtype, transposed)
    k_ref, v_ref = k_buf.clone(), v_buf.clone()
    k, v = (
        torch.randn(num_tokens, num_kv_heads, head_dim, device=DEVICE).to(dtype) for _ in range(2)
    )
    out_loc = torch.randperm(NUM_SLOTS, device=DEVICE)[:num_tokens]

    store_kv(k_buf, v_buf, k, v, out_loc)
    store_kv_ref(k_ref, v_ref, k, v, out_loc)

    # a copy: bit-exact, and the slots not written are untouched
    assert torch.equal(k_buf, k_ref)
    assert torch.equal(v_buf, v_ref)
    assert torch.equal(k_buf[:, out_loc], k.transpose(0, 1))


def test_store_kv_no_tokens_is_a_no_op() -> None:
    k_buf, v_buf = _buffers(2, 32, torch.float32, transposed=False)
    before = k_buf.clone()
    empty = torch.empty(0, 2, 32, device=DEVICE)
    store_kv(k_buf, v_buf, empty, empty, torch.empty(0, dtype=torch.int64, device=DEVICE))
    assert torch.equal(k_buf, before)


def test_store_kv_rejects_bad_inputs() -> None:
    k_buf, v_buf = _buffers(2, 32, torch.float32, transposed=False)
    k = torch.randn(3, 2, 32, device=DEVICE)
    loc = torch.tensor([1, 2, 3], device=DEVICE)
    with pytest.raises(ValueError, match=r"k and v must both be \[num_tokens, 2, 32\]"):
        store_kv(k_buf, v_buf, k[:, :1], k[:, :1], loc)
    with pytest.raises(ValueError, match="share one dtype"):
        store_kv(k_buf, v_buf, k.half(), k.half(), loc)
    with pytest.raises(ValueError, match="out_loc must be int64"):
        store_kv(k_buf, v_buf, k, k, loc.int())
    with pytest.raises(ValueError, match="out_loc must be int64"):
        store_kv(k_buf, v_buf, k, k, loc[:2])
    with pytest.raises(ValueError, match="must be contiguous"):
        store_kv(k_buf, v_buf, k.transpose(1, 2).contiguous().transpose(1, 2), k, loc)
    with pytest.raises(ValueError, match="k_buf and v_buf must both be"):
        store_kv(k_buf, v_buf[:1], k, k, loc)

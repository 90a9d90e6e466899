"""The kernels at Llama-3.1-8B's shapes in bfloat16, natively (CUDA only).

The CPU tests (the other files here) cover irregular small shapes under the
interpreter; these check the compiled kernels where tiles are full and
contexts are long.
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

HEADS, KV_HEADS, HEAD_DIM, HIDDEN = 32, 8, 128, 4096
BF16 = torch.bfloat16


def _pool(num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (KV_HEADS, num_slots, HEAD_DIM)
    return (torch.randn(shape, device="cuda", dtype=BF16) for _ in range(2))  # type: ignore[return-value]


def _table(seq_lens: list[int], num_slots: int) -> torch.Tensor:
    table = torch.zeros(len(seq_lens), max(seq_lens), dtype=torch.int32, device="cuda")
    perm = torch.randperm(num_slots - 1, device="cuda")[: sum(seq_lens)] + 1
    start = 0
    for i, n in enumerate(seq_lens):
        table[i, :n] = perm[start : start + n].int()
        start += n
    return table


def test_decode_attention_long_contexts() -> None:
    from kernels.decode_attention import decode_attention, decode_attention_ref

    seq_lens = [1, 4096, 777, 2048]
    k_buf, v_buf = _pool(sum(seq_lens) + 1)
    table = _table(seq_lens, k_buf.shape[1])
    rows = torch.arange(len(seq_lens), device="cuda")
    lens = torch.tensor(seq_lens, device="cuda")
    q = torch.randn(len(seq_lens), HEADS, HEAD_DIM, device="cuda", dtype=BF16)
    scale = 1 / math.sqrt(HEAD_DIM)
    for window in (None, 1024):
        got = decode_attention(q, k_buf, v_buf, table, rows, lens, scale, window)
        want = decode_attention_ref(q, k_buf, v_buf, table, rows, lens, scale, window)
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_extend_attention_with_long_prefixes() -> None:
    from kernels.extend_attention import extend_attention, extend_attention_ref

    prefix, extend = [0, 3000, 64], [1024, 200, 1]
    seq_lens = [p + e for p, e in zip(prefix, extend, strict=True)]
    k_buf, v_buf = _pool(sum(seq_lens) + 1)
    table = _table(seq_lens, k_buf.shape[1])
    args = (
        torch.arange(3, device="cuda"),
        torch.tensor(prefix, device="cuda"),
        torch.tensor(extend, device="cuda"),
    )
    q = torch.randn(sum(extend), HEADS, HEAD_DIM, device="cuda", dtype=BF16)
    scale = 1 / math.sqrt(HEAD_DIM)
    got = extend_attention(q, k_buf, v_buf, table, *args, scale)
    want = extend_attention_ref(q, k_buf, v_buf, table, *args, scale)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_pointwise_kernels_at_8b_widths() -> None:
    from kernels.rmsnorm import rms_norm, rms_norm_ref
    from kernels.rotary import apply_rotary_, apply_rotary_ref
    from kernels.silu_mul import silu_and_mul, silu_and_mul_ref

    x = torch.randn(512, HIDDEN, device="cuda", dtype=BF16)
    w = torch.randn(HIDDEN, device="cuda", dtype=BF16)
    torch.testing.assert_close(rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5), atol=2e-2, rtol=2e-2)
    gate_up = torch.randn(512, 2 * 14336, device="cuda", dtype=BF16)
    torch.testing.assert_close(
        silu_and_mul(gate_up), silu_and_mul_ref(gate_up), atol=2e-2, rtol=2e-2
    )
    q = torch.randn(512, HEADS, HEAD_DIM, device="cuda", dtype=BF16)
    k = torch.randn(512, KV_HEADS, HEAD_DIM, device="cuda", dtype=BF16)
    positions = torch.randint(0, 100_000, (512,), device="cuda")
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, HEAD_DIM, 2, device="cuda").float() / HEAD_DIM))
    want_q, want_k = apply_rotary_ref(q, k, positions, inv_freq)
    apply_rotary_(q, k, positions, inv_freq)
    torch.testing.assert_close(q, want_q, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(k, want_k, atol=2e-2, rtol=2e-2)


def test_sampling_over_a_128k_vocabulary() -> None:
    from kernels.sampling import sample_ref, sample_tokens

    bs, vocab = 8, 128256
    logits = torch.randn(bs, vocab, device="cuda") * 3
    batch = (
        logits,
        torch.tensor([0.0, 1.0, 0.7, 1.0, 1.2, 0.9, 1.0, 1.0], device="cuda"),
        torch.tensor([0, 0, 50, 0, 20, 0, 1, 0], device="cuda"),
        torch.tensor([1.0, 1.0, 1.0, 0.9, 0.8, 1.0, 1.0, 1.0], device="cuda"),
        torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 0.0], device="cuda"),
        torch.arange(8, device="cuda") * 7919,
        torch.arange(8, device="cuda") + 100,
    )
    # all but the rows whose top-p or min-p cut lands within rounding: exact
    assert sample_tokens(*batch).tolist() == sample_ref(*batch).tolist()

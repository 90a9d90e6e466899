"""Decode steps through DecodeGraphs give the eager steps' logits and KV writes.

On the CPU nothing is captured (``capture=False``): ``run`` executes the padded pass
on the static buffers eagerly, which is everything a graph replays. The GPU test
captures. ``DECODE_SPLIT`` is cut to 32 keys so that eager steps take 1 to 3 decode
splits against the graphs' fixed 16 (a 512-token table).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpu_testlib import KERNELS_DEVICE, drain, greedy, make_engine, prompts, run_all

from rt.errors import ConfigError
from rt.gpu import EngineConfig, EngineCore, SamplingParams
from rt.gpu.attention import triton_backend
from rt.gpu.attention.triton_backend import TritonAttention
from rt.gpu.cuda_graph import GRAPH_MAX_CONTEXT, DecodeGraphs, batch_ladder
from rt.gpu.forward_batch import ForwardBatch
from rt.gpu.kv_pool import KVPool
from rt.gpu.models.llama import LlamaForCausalLM

pytest.importorskip("triton")

# prompt lengths; request i asks for i + 2 tokens, so decode batches shrink 5, 4, 3, 2, 1
# (5 and 3 are padded to 8 and 4)
LENGTHS = [40, 70, 7, 33, 12]


def _engine(path: Path, **kwargs: object) -> EngineCore:
    return make_engine(path, attention_backend="triton", page_size=4, **kwargs)


def _graphs(core: EngineCore, max_bs: int = 8, capture: bool = False) -> DecodeGraphs:
    runner = core.runner
    assert isinstance(runner.model, LlamaForCausalLM)
    assert isinstance(runner.attn, TritonAttention)
    return DecodeGraphs(
        runner.model, runner.attn, runner.ops, max_bs=max_bs, device=runner.device, capture=capture
    )


def _graphs_of_runner(core: EngineCore) -> DecodeGraphs:
    """``_graphs`` without its type checks: whatever the runner holds."""
    r = core.runner
    return DecodeGraphs(r.model, r.attn, r.ops, max_bs=4, device=r.device, capture=False)  # type: ignore[arg-type]


def _add_staggered(core: EngineCore) -> None:
    for i, p in enumerate(prompts(len(LENGTHS), LENGTHS, seed=1)):
        core.add_request(f"r{i}", p, greedy(i + 2, ignore_eos=True))


def _written_slots(pool: KVPool, k: torch.Tensor, v: torch.Tensor) -> set[int]:
    """Slots whose K or V differ from the snapshot (k, v) in any layer or head."""
    changed = ((pool.k != k) | (pool.v != v)).any(-1).any(1).any(0)  # [num_slots]
    return set(changed.nonzero().flatten().tolist())


def _drain_comparing(
    core: EngineCore, graphs: DecodeGraphs, monkeypatch: pytest.MonkeyPatch, exact: bool
) -> list[int]:
    """Step ``core`` to the end; run each decode batch through the graphs, then eagerly
    (whose logits it goes on with), and compare. Returns the decode batch sizes."""
    eager = core.runner.forward
    attn = core.runner.attn
    assert isinstance(attn, TritonAttention)
    pool = attn.pool
    sizes = []

    def forward(batch: ForwardBatch) -> torch.Tensor:
        if not graphs.can_run(batch):
            assert not batch.is_decode
            return eager(batch)
        sizes.append(batch.batch_size)
        k, v = pool.k.clone(), pool.v.clone()
        graph_logits = graphs.run(batch).clone()
        # the batch's own slots and the padding's dummy slot 0, nothing else
        own = set(batch.out_cache_loc.tolist())
        assert _written_slots(pool, k, v) <= own | {0}
        graph_k, graph_v = pool.k.clone(), pool.v.clone()
        logits = eager(batch)
        assert graph_logits.shape == logits.shape
        if exact or batch.batch_size in graphs.sizes:
            assert torch.equal(graph_logits, logits), batch.batch_size
            # the eager step rewrote the batch's slots with the graph's very K/V
            assert torch.equal(pool.k, graph_k) and torch.equal(pool.v, graph_v)
        else:
            # padded, through plain matmuls: a GEMM's row can round differently with
            # the row count (MKL here, cuBLAS alike), by a few float32 ulps
            torch.testing.assert_close(graph_logits, logits, rtol=1e-5, atol=1e-4)
            assert torch.equal(graph_logits.argmax(-1), logits.argmax(-1))
        return logits

    monkeypatch.setattr(core.runner, "forward", forward)
    drain(core)
    assert not core.has_work
    return sizes


# Seen on an H200 (2026-11-27): a batch of 5 padded to 8 gave logits that were not
# bitwise the eager step's in this mode (batch 5 was the first compared); the plain
# variant's tolerance and the greedy tokens held. Not yet explained (docs/benchmarks.md).
_BITWISE_ON_CUDA = pytest.mark.xfail(
    torch.cuda.is_available(), reason="not bitwise on CUDA (H200, 2026-11-27)", strict=False
)


@pytest.mark.parametrize(
    ("arch", "exact"),
    [
        pytest.param("llama", True, marks=_BITWISE_ON_CUDA),
        pytest.param("mistral", True, marks=_BITWISE_ON_CUDA),
        ("llama", False),
    ],
    ids=["llama-bitwise", "mistral-bitwise", "llama-plain-matmuls"],
)
def test_graph_steps_equal_eager(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch, arch: str, exact: bool
) -> None:
    """Decode batches of 5, 4, 3, 2 and 1 requests through the graphs' padded pass.
    mistral: MQA and a sliding window (12) shorter than the contexts."""
    monkeypatch.setattr(triton_backend, "DECODE_SPLIT", 32)
    core = _engine(checkpoints[arch])
    if exact:
        # batch-invariant linears (fixed 16-row blocks): a padded batch changes no row's
        # matmul, so what is left to differ is the graphs' own doing; attention stays on
        # the decode kernel (the backend is not deterministic)
        monkeypatch.setattr(core.runner.ops, "deterministic", True)
    # else: the ladder's sizes bitwise; padded ones (5 -> 8, 3 -> 4) to float32 rounding
    graphs = _graphs(core)
    _add_staggered(core)
    assert _drain_comparing(core, graphs, monkeypatch, exact=exact) == [5, 4, 3, 2, 1]


def test_graphs_under_overlap_scheduling_give_the_plain_engines_outputs(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA both are on by default: a decode batch whose tokens are still on the
    device (overlap) goes through the static buffers and a graph, seeded draws too.
    Linears batch-invariant, so that padding cannot round a token differently."""
    path = checkpoints["qwen3"]
    ps = prompts(len(LENGTHS), LENGTHS, seed=2)
    reqs = {
        f"r{i}": (p, SamplingParams(max_new_tokens=i + 6, ignore_eos=True, temperature=0.7 * (i % 2), seed=i))
        for i, p in enumerate(ps)
    }  # fmt: skip
    plain_core = _engine(path)
    monkeypatch.setattr(plain_core.runner.ops, "deterministic", True)
    plain = run_all(plain_core, reqs)
    core = _engine(path, overlap_schedule=True)
    monkeypatch.setattr(core.runner.ops, "deterministic", True)
    core.runner.graphs = _graphs(core)  # the padded static pass, uncaptured (no CUDA)
    got = run_all(core, reqs)
    assert core.runner.graph_replays >= 5
    assert {k: r["tokens"] for k, r in got.items()} == {k: r["tokens"] for k, r in plain.items()}
    assert all(len(got[f"r{i}"]["tokens"]) == i + 6 for i in range(len(ps)))


def test_static_decode_attention_of_a_padded_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # one request of 45 keys and a padding row (seq_len 0, slot 0): the request's
    # output is the eager step's, the padding's zeros, and only the two slots change
    monkeypatch.setattr(triton_backend, "DECODE_SPLIT", 32)
    torch.manual_seed(0)
    num_heads, num_kv_heads, head_dim, seq_len = 4, 2, 32, 45
    pool = KVPool(16, 4, 1, num_kv_heads, head_dim, torch.float32, KERNELS_DEVICE)
    pool.k[:, :, 4:].normal_()  # every page but the reserved page 0
    pool.v[:, :, 4:].normal_()
    req_to_token = torch.zeros(3, 64, dtype=torch.int64, device=KERNELS_DEVICE)
    req_to_token[1, :seq_len] = torch.arange(4, 4 + seq_len)
    attn = TritonAttention(pool, req_to_token, [None])
    slot = seq_len + 3
    q = torch.randn(2, num_heads, head_dim).to(KERNELS_DEVICE)
    k, v = (torch.randn(2, num_kv_heads, head_dim).to(KERNELS_DEVICE) for _ in range(2))

    batch = ForwardBatch(
        input_ids=torch.zeros(1, dtype=torch.int64),
        positions=torch.tensor([seq_len - 1]),
        out_cache_loc=torch.tensor([slot]),
        req_rows=torch.tensor([1]),
        prefix_lens=[seq_len - 1],
        extend_lens=[1],
        sample_indices=torch.arange(1),
    )
    attn.prepare(batch)
    expected = attn.forward(0, q[:1], k[:1], v[:1])
    k_eager, v_eager = pool.k.clone(), pool.v.clone()

    attn.prepare_static_decode(
        *(torch.tensor(t, device=KERNELS_DEVICE) for t in ([1, 0], [seq_len, 0], [slot, 0])), 512
    )
    out = attn.forward(0, q, k, v)
    assert torch.equal(out[:1], expected)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert _written_slots(pool, k_eager, v_eager) == {0}  # the request's slot: same K/V
    assert torch.equal(pool.k[0, :, 0], k[1]) and torch.equal(pool.v[0, :, 0], v[1])


def _decode_batch(seq_lens: list[int], **kwargs: object) -> ForwardBatch:
    bs = len(seq_lens)
    args: dict = dict(
        input_ids=torch.zeros(bs, dtype=torch.int64),
        positions=torch.tensor(seq_lens) - 1,
        out_cache_loc=torch.zeros(bs, dtype=torch.int64),
        req_rows=torch.zeros(bs, dtype=torch.int64),
        prefix_lens=[n - 1 for n in seq_lens],
        extend_lens=[1] * bs,
        sample_indices=torch.arange(bs),
    )
    return ForwardBatch(**{**args, **kwargs})


def test_can_run(checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    core = _engine(checkpoints["llama"])
    graphs = _graphs(core)
    assert graphs.max_context == core.cache.table.slots.shape[1] == 512
    assert graphs.sizes == [1, 2, 4, 8]
    assert graphs.can_run(_decode_batch([10]))
    assert graphs.can_run(_decode_batch([3] * 8))
    assert graphs.can_run(_decode_batch([512, 1]))
    assert not graphs.can_run(_decode_batch([3] * 9))  # past max_bs
    assert not graphs.can_run(_decode_batch([513, 1]))  # past max_context
    extend = ForwardBatch(
        input_ids=torch.zeros(3, dtype=torch.int64),
        positions=torch.arange(3),
        out_cache_loc=torch.zeros(3, dtype=torch.int64),
        req_rows=torch.zeros(1, dtype=torch.int64),
        prefix_lens=[0],
        extend_lens=[3],
        sample_indices=torch.tensor([2]),
    )
    assert not graphs.can_run(extend)
    # decode-shaped, but a prefill chunk that samples nothing, or asks prompt logprobs
    assert not graphs.can_run(_decode_batch([5, 9], sample_indices=torch.tensor([1])))
    spans = dict(sampled_rows=torch.arange(2), prompt_spans=[(0, 0, 1, 4)])
    assert not graphs.can_run(_decode_batch([5, 9], **spans))

    monkeypatch.setattr("rt.gpu.cuda_graph.GRAPH_MAX_CONTEXT", 100)
    capped = _graphs(core)
    assert capped.max_context == 100 < GRAPH_MAX_CONTEXT
    assert capped.can_run(_decode_batch([100])) and not capped.can_run(_decode_batch([101]))


def test_batch_ladder() -> None:
    assert batch_ladder(1) == [1]
    assert batch_ladder(3) == [1, 2, 3]
    assert batch_ladder(8) == [1, 2, 4, 8]
    assert batch_ladder(20) == [1, 2, 4, 8, 16, 20]
    assert batch_ladder(32) == [1, 2, 4, 8, 16, 24, 32]
    assert batch_ladder(256)[-3:] == [240, 248, 256] and len(batch_ladder(256)) == 35
    with pytest.raises(ConfigError, match="at least 1"):
        batch_ladder(0)


def test_graphs_refuse_what_they_cannot_run(checkpoints: dict[str, Path]) -> None:
    path = checkpoints["llama"]
    with pytest.raises(ConfigError, match="attention_backend='triton'"):
        _graphs_of_runner(make_engine(path, attention_backend="torch"))
    with pytest.raises(ConfigError, match="outside deterministic mode"):
        _graphs_of_runner(make_engine(path, attention_backend="triton", deterministic=True))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="needs a CUDA device"):
            _graphs(_engine(path), capture=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_graphs_give_the_eager_greedy_tokens(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA with the triton backend an engine captures graphs by default and replays
    them for decode batches (5 and 3 padded to 8 and 4); greedy tokens equal an eager
    engine's (cuda_graph=False)."""
    path = checkpoints["llama"]
    reqs = {
        f"r{i}": (p, greedy(3 * i + 4, ignore_eos=True))
        for i, p in enumerate(prompts(len(LENGTHS), LENGTHS, seed=1))
    }
    eager_core = _engine(path, device="cuda", cuda_graph=False)
    assert eager_core.runner.graphs is None
    eager = run_all(eager_core, reqs)

    core = _engine(path, device="cuda", cuda_graph_max_bs=8)
    graphs = core.runner.graphs
    assert graphs is not None and graphs.sizes == [1, 2, 4, 8]
    replayed: list[int] = []
    run = graphs.run

    def counted(batch: ForwardBatch) -> torch.Tensor:
        replayed.append(batch.batch_size)
        return run(batch)

    monkeypatch.setattr(graphs, "run", counted)
    with_graphs = run_all(core, reqs)
    assert {5, 3} <= set(replayed) and core.runner.graph_replays == len(replayed)
    assert {rid: r["tokens"] for rid, r in with_graphs.items()} == {
        rid: r["tokens"] for rid, r in eager.items()
    }


def test_the_engine_config_says_where_graphs_cannot_run(checkpoints: dict[str, Path]) -> None:
    path = checkpoints["llama"]
    cuda = dict(model_path=path, device="cuda", attention_backend="triton")
    assert EngineConfig(**cuda).use_cuda_graph  # type: ignore[arg-type]
    assert not EngineConfig(**cuda, cuda_graph=False).use_cuda_graph  # type: ignore[arg-type]
    assert EngineConfig(**cuda, cuda_graph_max_bs=64, max_running_requests=16).graph_max_bs == 16  # type: ignore[arg-type]
    refusals = {
        "CUDA device": dict(model_path=path, attention_backend="triton"),
        "attention_backend='triton'": dict(
            model_path=path, device="cuda", attention_backend="torch"
        ),
        "deterministic": {**cuda, "deterministic": True},
        "null model": {**cuda, "load_format": "null"},
    }
    for why, options in refusals.items():
        assert not EngineConfig(**options).use_cuda_graph  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=why):
            EngineConfig(**options, cuda_graph=True)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cuda_graph_max_bs"):
        EngineConfig(**cuda, cuda_graph_max_bs=0)  # type: ignore[arg-type]
    if KERNELS_DEVICE == "cpu":  # on the CPU nothing is captured: the runner holds no graphs
        assert make_engine(path, attention_backend="triton").runner.graphs is None


def test_cuda_runs_the_kernels_with_graphs_and_overlap_by_default(
    checkpoints: dict[str, Path],
) -> None:
    """A user who asks for CUDA and nothing else gets the fast path: the triton backend,
    CUDA graphs and overlap scheduling. The CPU keeps the torch reference, which needs
    no interpreter, unless deterministic mode asks for the kernels."""
    path = checkpoints["llama"]
    cuda = EngineConfig(model_path=path, device="cuda")
    assert (cuda.backend, cuda.use_cuda_graph, cuda.use_overlap) == ("triton", True, True)
    cpu = EngineConfig(model_path=path)
    assert (cpu.backend, cpu.use_cuda_graph, cpu.use_overlap) == ("torch", False, False)
    assert EngineConfig(model_path=path, deterministic=True).backend == "triton"
    assert (
        EngineConfig(model_path=path, device="cuda", attention_backend="torch").backend == "torch"
    )

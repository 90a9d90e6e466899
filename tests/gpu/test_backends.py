"""The triton backend against the torch reference, and deterministic mode.

On the CPU the kernels run under Triton's interpreter, so these use short
prompts and few tokens; the shapes that matter for speed are the GPU bench's.
On a machine with CUDA both backends of each comparison run on the GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpu_testlib import KERNELS_DEVICE, greedy, make_engine, prompts, run_all

from rt.assets import default_model_path
from rt.errors import ConfigError
from rt.gpu import EngineConfig, SamplingParams
from rt.gpu.attention import triton_backend

pytest.importorskip("triton")


def _reqs(lengths: list[int], params: SamplingParams, seed: int = 0) -> dict:
    return {f"r{i}": (p, params) for i, p in enumerate(prompts(len(lengths), lengths, seed))}


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_triton_greedy_equals_torch(checkpoints: dict[str, Path], arch: str) -> None:
    # shared prefixes (radix hits), a chunked prefill, mistral's window shorter than the prompts
    base = prompts(1, [21], seed=3)[0]
    reqs = _reqs([3, 17, 40], greedy(6))
    reqs["shared"] = ([*base, 5, 6, 7], greedy(6))
    reqs["shared2"] = ([*base, 9], greedy(6))
    out = {}
    for backend in ("torch", "triton"):
        engine = make_engine(
            checkpoints[arch],
            attention_backend=backend,
            device=KERNELS_DEVICE,
            page_size=4,
            chunked_prefill_size=16,
        )
        out[backend] = {rid: r["tokens"] for rid, r in run_all(engine, reqs).items()}
    assert out["triton"] == out["torch"]
    assert all(len(t) == 6 or t[-1] == 2 for t in out["torch"].values())


def test_triton_decode_over_several_splits_equals_torch(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # contexts past the decode kernel's split size take several splits (2 and 3 here)
    monkeypatch.setattr(triton_backend, "DECODE_SPLIT", 32)
    reqs = _reqs([40, 70, 7], greedy(4))
    out = [
        {
            rid: r["tokens"]
            for rid, r in run_all(
                make_engine(checkpoints["llama"], attention_backend=b, device=KERNELS_DEVICE), reqs
            ).items()
        }
        for b in ("torch", "triton")
    ]
    assert out[0] == out[1]


def test_triton_on_the_default_model_equals_torch() -> None:
    params = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)
    reqs = {f"d{i}": (p, params) for i, p in enumerate(prompts(3, [12, 20, 5], seed=4))}
    out = [
        {
            rid: r["tokens"]
            for rid, r in run_all(
                make_engine(default_model_path(), attention_backend=b, device=KERNELS_DEVICE), reqs
            ).items()
        }
        for b in ("torch", "triton")
    ]
    assert out[0] == out[1]


def test_triton_seeded_sampling_draws_the_torch_tokens(checkpoints: dict[str, Path]) -> None:
    kinds = [
        dict(temperature=0.8),
        dict(temperature=1.2, top_k=5),
        dict(temperature=1.0, top_p=0.7),
        dict(temperature=0.9, min_p=0.1, top_k=40),
        dict(temperature=0.0),
    ]
    reqs = {
        f"s{i}": (p, SamplingParams(max_new_tokens=8, seed=100 + i, ignore_eos=True, **kind))  # type: ignore[arg-type]
        for i, (p, kind) in enumerate(
            zip(prompts(5, [4, 9, 15, 6, 11], seed=5), kinds, strict=True)
        )
    }
    out = [
        {
            rid: r["tokens"]
            for rid, r in run_all(
                make_engine(checkpoints["qwen2"], attention_backend=b, device=KERNELS_DEVICE), reqs
            ).items()
        }
        for b in ("torch", "triton")
    ]
    assert out[0] == out[1]


def _logprob_trace(result: dict) -> list[tuple[int, float, list[float]]]:
    return list(
        zip(result["tokens"], result["logprobs"], [list(t) for t in result["top"]], strict=True)
    )


def test_deterministic_logits_do_not_depend_on_the_batch(checkpoints: dict[str, Path]) -> None:
    """The same request alone and in a batch of 16 gives bit-identical logprobs at every
    step, and a prefix computed by decode gives the same logits as one prefilled."""
    path = checkpoints["llama"]
    target = prompts(1, [19], seed=6)[0]
    params = SamplingParams(
        temperature=0.0, max_new_tokens=5, ignore_eos=True, logprobs=True, top_logprobs=5
    )
    alone = run_all(make_engine(path, deterministic=True), {"x": (target, params)})["x"]

    others = prompts(15, [3, 8, 25, 11, 20, 2, 17, 9, 14, 5, 14, 22, 6, 18, 12], seed=7)
    reqs = {f"o{i}": (p, params) for i, p in enumerate(others)}
    reqs["x"] = (target, params)
    batched = run_all(make_engine(path, deterministic=True, chunked_prefill_size=32), reqs)["x"]
    assert _logprob_trace(batched) == _logprob_trace(alone)

    # the first 3 generated tokens, now part of the prompt: prefilled, not decoded
    extended = run_all(
        make_engine(path, deterministic=True, enable_prefix_cache=False),
        {"y": ([*target, *alone["tokens"][:3]], params)},
    )["y"]
    assert _logprob_trace(extended)[:2] == _logprob_trace(alone)[3:]


def test_deterministic_mode_needs_the_triton_backend(checkpoints: dict[str, Path]) -> None:
    config = EngineConfig(model_path=checkpoints["llama"], deterministic=True)
    assert config.backend == "triton"
    with pytest.raises(
        ConfigError, match="deterministic inference needs attention_backend='triton'"
    ):
        EngineConfig(model_path=checkpoints["llama"], deterministic=True, attention_backend="torch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_backends_on_cuda_match_torch_in_bfloat16(backend: str) -> None:
    # the default model: head_dim 64, which flashinfer's kernels are built for
    if backend == "flashinfer":
        pytest.importorskip("flashinfer")
    reqs = _reqs([3, 17, 40, 300], greedy(8))
    out = {}
    for b in ("torch", backend):
        engine = make_engine(
            default_model_path(), attention_backend=b, device="cuda", dtype="bfloat16", page_size=16
        )
        out[b] = {rid: r["tokens"] for rid, r in run_all(engine, reqs).items()}
    # bfloat16: a near-tie may go either way; most sequences agree throughout
    same = sum(out["torch"][rid] == out[backend][rid] for rid in reqs)
    assert same >= len(reqs) - 1, out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_deterministic_on_cuda_in_bfloat16(checkpoints: dict[str, Path]) -> None:
    path = checkpoints["llama"]
    target = prompts(1, [19], seed=6)[0]
    params = SamplingParams(
        temperature=0.0, max_new_tokens=8, ignore_eos=True, logprobs=True, top_logprobs=5
    )
    kwargs = dict(deterministic=True, device="cuda", dtype="bfloat16")
    alone = run_all(make_engine(path, **kwargs), {"x": (target, params)})["x"]
    others = prompts(15, [3, 8, 25, 11, 200, 2, 17, 9, 30, 5, 14, 22, 6, 33, 12], seed=7)
    reqs = {f"o{i}": (p, params) for i, p in enumerate(others)}
    reqs["x"] = (target, params)
    batched = run_all(make_engine(path, chunked_prefill_size=64, **kwargs), reqs)["x"]
    assert _logprob_trace(batched) == _logprob_trace(alone)


def test_the_triton_backend_on_cpu_tensors_needs_the_interpreter(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where CUDA is present the kernels are compiled for the GPU (as if not interpreted
    here): the triton backend on the CPU is a ConfigError that says what to do, not a
    failure inside the first kernel launched."""
    import kernels

    monkeypatch.setattr(kernels, "interpreted", lambda: False)
    with pytest.raises(ConfigError, match=r"TRITON_INTERPRET=1.*attention_backend 'torch'"):
        make_engine(checkpoints["llama"], attention_backend="triton", device="cpu")

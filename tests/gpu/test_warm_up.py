"""EngineCore.warm_up: throwaway requests at start-up that leave no trace, and (on a
GPU) leave no kernel to compile for the first real requests."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_testlib import KERNELS_DEVICE, drain, make_engine, prompts

import kernels
from rt.gpu import SamplingParams

MIX: list[SamplingParams] = [
    SamplingParams(max_new_tokens=6),  # unseeded: its seed comes from the engine's stream
    SamplingParams(max_new_tokens=6, temperature=0.0),
    SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.8, seed=11, logprobs=True),
    SamplingParams(max_new_tokens=6, n=2, repetition_penalty=1.2),  # unseeded, two samples
]


def serve(engine: Any, ids: list[list[int]]) -> dict[str, list[list[int]]]:
    for i, (prompt, params) in enumerate(zip(ids, MIX, strict=True)):
        engine.add_request(f"r{i}", prompt, params)
    results = drain(engine)
    return {rid: r["tokens"] for rid, r in sorted(results.items())}


@pytest.mark.parametrize("overlap", [False, True])
def test_a_warmed_up_engine_serves_what_a_cold_one_does(
    checkpoints: dict[str, Path], overlap: bool
) -> None:
    ids = prompts(4, [9, 16, 17, 30], seed=3)
    cold = make_engine(checkpoints["llama"], overlap_schedule=overlap)
    warm = make_engine(checkpoints["llama"], overlap_schedule=overlap)
    steps: list[str] = []
    assert warm.warm_up(lambda out, s: steps.append(out.forward_mode)) == len(steps)
    assert "extend" in steps and "decode" in steps
    # nothing stays: no request, no cached prefix, no freed page missing, no retraction
    assert not warm.has_work
    assert warm.stats() == cold.stats()
    warm.check_integrity()
    # the same tokens, the unseeded requests' included (the stream of seeds is untouched)
    assert serve(warm, ids) == serve(cold, ids)
    assert warm.stats() == cold.stats()


def test_warm_up_is_refused_once_requests_came(checkpoints: dict[str, Path]) -> None:
    engine = make_engine(checkpoints["llama"])
    engine.add_request("r", [5, 6, 7], SamplingParams(max_new_tokens=2))
    with pytest.raises(RuntimeError, match="already holds requests"):
        engine.warm_up()


@pytest.mark.parametrize(("context", "steps"), [(3, 0), (4, 6)])
def test_warm_up_leaves_out_prompts_a_small_context_cannot_hold(
    checkpoints: dict[str, Path], context: int, steps: int
) -> None:
    # three new tokens each: a context of 4 holds the 1-token prompt only, served in
    # two rounds (alone, then with all the others there are) of a prefill and two decodes
    engine = make_engine(checkpoints["llama"], context_length=context)
    assert engine.warm_up() == steps
    assert not engine.has_work


def compiled_kernels() -> dict[str, int]:
    """How many compiled variants each of the kernels' Triton functions holds."""
    from triton.runtime.jit import JITFunction

    counts: dict[str, int] = {}
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"kernels.{info.name}")
        for name, obj in vars(module).items():
            fn = getattr(obj, "fn", obj)  # (an autotuner wraps its JITFunction)
            if isinstance(fn, JITFunction):
                caches = fn.device_caches.values()
                counts[f"{info.name}.{name}"] = sum(len(cache[0]) for cache in caches)
    return counts


@pytest.mark.skipif(KERNELS_DEVICE != "cuda", reason="Triton compiles kernels on a GPU only")
def test_after_warm_up_a_prompt_of_any_length_compiles_no_kernel(
    checkpoints: dict[str, Path],
) -> None:
    engine = make_engine(checkpoints["llama"], attention_backend="triton")
    engine.warm_up()
    before = compiled_kernels()
    assert sum(before.values()) > 0
    g = torch.Generator().manual_seed(0)
    for i, length in enumerate([2, 5, 15, 32, 33, 48, 64, 100]):
        ids = torch.randint(3, 256, (length,), generator=g).tolist()
        engine.add_request(f"r{i}", ids, MIX[i % len(MIX)])
        drain(engine)
    after = compiled_kernels()
    assert after == before, {k: (before.get(k), n) for k, n in after.items() if before.get(k) != n}

"""Decode steps through torch.compile (``torch_compile=True``) give the eager engine's
tokens, greedy and seeded, with batches padded to the compiled sizes; the options
that cannot compile are refused. These compile real graphs on the CPU (a few seconds
a batch size for the tiny checkpoints)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gpu_testlib import greedy, make_engine, prompts, run_all

from rt.errors import ConfigError
from rt.gpu import EngineConfig, SamplingParams

# prompt lengths; request i asks for i + 3 tokens, so decode batches shrink 5, 4, 3, 2, 1
# (3 is padded to 4; 5 runs eagerly past the largest compiled size, 4)
LENGTHS = [40, 70, 7, 33, 12]


def _requests() -> dict[str, tuple[list[int], SamplingParams]]:
    out = {}
    for i, p in enumerate(prompts(len(LENGTHS), LENGTHS, seed=3)):
        params = (
            greedy(i + 3, ignore_eos=True)
            if i % 2 == 0
            else SamplingParams(max_new_tokens=i + 3, ignore_eos=True, temperature=1.0, seed=i)
        )
        out[f"r{i}"] = (p, params)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3"])  # q/k norms, GQA, head_dim != hidden / heads
def test_compiled_decode_draws_the_eager_tokens(checkpoints: dict[str, Path], arch: str) -> None:
    eager = run_all(make_engine(checkpoints[arch]), _requests())
    core = make_engine(checkpoints[arch], torch_compile=True, torch_compile_max_bs=4)
    compiled = core.runner.compiled
    assert compiled is not None and compiled.sizes == [1, 2, 4]
    got = run_all(core, _requests())
    assert {k: v["tokens"] for k, v in got.items()} == {k: v["tokens"] for k, v in eager.items()}
    # every decode step of at most 4 requests ran compiled: 4, 3, 2 and 1 in flight
    assert compiled.runs >= 4


@pytest.mark.slow
def test_two_compiled_engines_in_one_process_each_run_their_own_weights(
    checkpoints: dict[str, Path],
) -> None:
    """Dynamo keeps graphs on the code object, and the weights are frozen into them:
    a second engine used to replay the first one's graphs, with the first one's weights."""
    path, reqs = checkpoints["llama"], {"a": ([5, 6, 7, 8], greedy(12, ignore_eos=True))}
    cores = [
        make_engine(
            path, load_format="dummy", seed=seed, torch_compile=True, torch_compile_max_bs=1
        )
        for seed in (1, 2)
    ]
    for seed, core in zip((1, 2), cores, strict=True):
        eager = run_all(make_engine(path, load_format="dummy", seed=seed), reqs)
        assert run_all(core, reqs)["a"]["tokens"] == eager["a"]["tokens"], seed
        assert core.runner.compiled is not None and core.runner.compiled.runs > 0


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"device": "cuda"}, "for the CPU"),
        ({"attention_backend": "triton"}, "attention_backend='torch'"),
        ({"load_format": "null"}, "null model"),
        ({"torch_compile_max_bs": 0}, "torch_compile_max_bs"),
    ],
)
def test_what_cannot_compile_is_refused(options: dict[str, Any], why: str) -> None:
    options = {"torch_compile": True, **options}
    with pytest.raises(ConfigError, match=why):
        EngineConfig(model_path=None, **options)


def test_sliding_window_models_are_refused_at_start(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="sliding-window"):
        make_engine(checkpoints["mistral"], torch_compile=True)

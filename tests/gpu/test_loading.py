"""Model directories: sharded weights, tokenizer files, stop ids, errors; dummy weights and dtypes."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_testlib import VOCAB, greedy, hf_greedy, make_engine, prompts, run_all

from rt.errors import ModelLoadError, UnsupportedModelError
from rt.gpu import EngineConfig, EngineCore, ModelConfig
from rt.gpu.model_dir import load_tokenizer, read_model_dir


def test_sharded_checkpoint_loads_like_a_single_file(
    tmp_path: Path, checkpoints: dict[str, Path]
) -> None:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoints["qwen3"], dtype=torch.float32
    )
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ps = {f"r{i}": (p, greedy(6)) for i, p in enumerate(prompts(2, [7, 19], seed=8))}
    one = run_all(make_engine(checkpoints["qwen3"]), ps)
    sharded = run_all(make_engine(tmp_path / "sharded"), ps)
    assert {k: v["tokens"] for k, v in one.items()} == {k: v["tokens"] for k, v in sharded.items()}


def test_loading_logs_progress_without_a_terminal(
    checkpoints: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="rt.gpu"):
        make_engine(checkpoints["llama"])
    assert "loaded weights model.safetensors (1/1 shards)" in caplog.text


def test_tokenizer_chat_template_and_generation_config(
    tmp_path: Path, checkpoints: dict[str, Path]
) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    path = tmp_path / "model"
    shutil.copytree(checkpoints["llama"], path)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        ["hello world", "the quick brown fox"] * 20,
        trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "<s>", "</s>"]),
    )
    tok.save(str(path / "tokenizer.json"))
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    p = prompts(1, [10], seed=9)[0]
    tokens = run_all(make_engine(path), {"a": (p, greedy(8, ignore_eos=True))})["a"]["tokens"]
    stop = next(t for t in tokens[2:] if t != 2)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop, 2]}))
    files = read_model_dir(path)
    assert files.eos_token_ids == (stop, 2)
    assert files.chat_template == template
    assert load_tokenizer(files).encode("hello world").tokens == ["hello", "world"]
    engine = make_engine(path)
    assert engine.model_files is not None and engine.model_files.chat_template == template
    res = run_all(engine, {"a": (p, greedy(8))})["a"]
    assert res["final"].finish_reason == "stop" and res["tokens"][-1] == stop


def test_errors_name_the_problem(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        make_engine(tmp_path)
    bad = tmp_path / "gpt2"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(
        UnsupportedModelError,
        match=r"GPT2LMHeadModel.*LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM",
    ):
        make_engine(bad)
    raw = json.loads((checkpoints["llama"] / "config.json").read_text())
    yarn = tmp_path / "yarn"
    yarn.mkdir()
    (yarn / "config.json").write_text(
        json.dumps({**raw, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}})
    )
    with pytest.raises(UnsupportedModelError, match="rope type 'yarn'"):
        make_engine(yarn)
    no_weights = tmp_path / "noweights"
    no_weights.mkdir()
    shutil.copy(checkpoints["llama"] / "config.json", no_weights)
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors weights"):
        make_engine(no_weights)
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json not found"):
        load_tokenizer(read_model_dir(checkpoints["llama"]))
    wrong = tmp_path / "wrong"
    shutil.copytree(checkpoints["llama"], wrong)
    (wrong / "config.json").write_text(json.dumps({**raw, "intermediate_size": 96}))
    with pytest.raises(ModelLoadError, match="expected shape"):
        make_engine(wrong)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_dummy_weights_in_each_dtype(checkpoints: dict[str, Path], dtype: str) -> None:
    cfg = ModelConfig.from_dir(checkpoints["mistral"])
    reqs = {
        f"r{i}": (p, greedy(6, ignore_eos=True)) for i, p in enumerate(prompts(2, [9, 20], seed=10))
    }

    def build() -> EngineCore:
        return EngineCore(
            EngineConfig(
                model_config=cfg,
                load_format="dummy",
                dtype=dtype,
                max_total_tokens=256,
                page_size=16,
            )
        )

    engine = build()
    assert engine.cache.tree is not None and engine.runner.model.lm_head.weight.dtype == getattr(
        torch, dtype
    )  # type: ignore[union-attr]
    first = run_all(engine, reqs)
    assert all(len(r["tokens"]) == 6 for r in first.values())
    assert run_all(build(), reqs) == first  # dummy weights are seeded


def test_dummy_weights_take_any_seed(checkpoints: dict[str, Path]) -> None:
    """A seed past about 1.8e13 made the draw's own seed overflow torch's (a crash at
    every start of the scheduler: a loop of restarts, then an escalation)."""
    cfg = ModelConfig.from_dir(checkpoints["mistral"])
    for seed in (2**62, -(2**62)):
        config = EngineConfig(model_config=cfg, load_format="dummy", seed=seed)
        engine = EngineCore(dataclasses.replace(config, max_total_tokens=256))
        assert run_all(engine, {"r": (prompts(1, [5])[0], greedy(2, ignore_eos=True))})


def test_tied_embeddings_share_storage(checkpoints: dict[str, Path]) -> None:
    model = make_engine(checkpoints["qwen2"], dtype="bfloat16").runner.model
    assert model.lm_head.weight is model.model.embed_tokens.weight  # type: ignore[union-attr]


def test_a_head_of_its_own_is_used_though_config_ties_it(
    tmp_path: Path, checkpoints: dict[str, Path], hf_models: dict[str, Any]
) -> None:
    """config.json ties the head to the embedding, and the checkpoint holds both,
    different: rt copied both into the one tensor (which won depended on the order
    of the shards): its tokens were neither's. transformers keeps them apart."""
    from safetensors.torch import load_file, save_file

    path = tmp_path / "tied-config"
    shutil.copytree(checkpoints["llama"], path)
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, "tie_word_embeddings": True}))
    tensors = load_file(path / "model.safetensors")
    assert not torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"])
    p = prompts(1, [12], seed=4)[0]
    got = run_all(make_engine(path), {"a": (p, greedy(12))})["a"]["tokens"]
    assert got == hf_greedy(hf_models["llama"], p, 12)  # (the untied model's)
    # the one tensor saved twice: tied again (no second copy of the embedding; in
    # bfloat16: float32 on the CPU gives the head a column-major copy of its own)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, path / "model.safetensors")
    model = make_engine(path, dtype="bfloat16").runner.model
    assert model.lm_head.weight is model.model.embed_tokens.weight  # type: ignore[union-attr]


def test_the_tokenizers_eos_stops_generation(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    """A model whose configs name no EOS, and whose tokenizer does: rt never
    stopped there (vLLM and SGLang stop at the tokenizer's EOS)."""
    from tokenizers import Tokenizer, models

    path = tmp_path / "model"
    shutil.copytree(checkpoints["llama"], path)
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, "eos_token_id": None}))
    (path / "generation_config.json").unlink(missing_ok=True)
    vocab = {f"t{i}": i for i in range(VOCAB)}
    Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0")).save(str(path / "tokenizer.json"))
    p = prompts(1, [10], seed=9)[0]
    assert read_model_dir(path).eos_token_ids == ()
    tokens = run_all(make_engine(path), {"a": (p, greedy(8))})["a"]["tokens"]
    assert len(tokens) == 8
    stop = tokens[3]
    # (as transformers writes it: each special token with its id)
    added = {str(stop): {"content": f"t{stop}", "special": True}}
    config = {"eos_token": f"t{stop}", "added_tokens_decoder": added}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    assert read_model_dir(path).eos_token_ids == (stop,)
    # a tokenizer_config.json without them: tokenizer.json says the id (its vocabulary,
    # or its added tokens)
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": f"t{stop}"}))
    assert read_model_dir(path).eos_token_ids == (stop,)
    special = Tokenizer(models.WordLevel(vocab={"t0": 0}, unk_token="t0"))
    special.add_special_tokens([f"t{stop}"])  # (id 1 there)
    special.save(str(path / "tokenizer.json"))
    assert read_model_dir(path).eos_token_ids == (1,)
    Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0")).save(str(path / "tokenizer.json"))
    res = run_all(make_engine(path), {"a": (p, greedy(8))})["a"]
    assert (
        res["final"].finish_reason == "stop" and res["tokens"] == tokens[: tokens.index(stop) + 1]
    )


def test_running_out_of_memory_is_not_the_models_fault(
    tmp_path: Path, checkpoints: dict[str, Path]
) -> None:
    """A ModelLoadError refuses the start for good (the files would fail alike);
    a host short of memory may have it later: torch's error, as it is."""
    path = tmp_path / "huge"
    path.mkdir()
    raw = json.loads((checkpoints["llama"] / "config.json").read_text())
    # a 256 PiB embedding: past any address space (57 bits with 5-level paging),
    # whatever the overcommit policy
    huge = {**raw, "vocab_size": 1 << 34, "hidden_size": 1 << 22}
    (path / "config.json").write_text(json.dumps(huge))
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        make_engine(path, max_total_tokens=64)


def test_float32_linear_weights_are_column_major_on_the_cpu(checkpoints: dict[str, Path]) -> None:
    # MKL multiplies by a contiguous [in, out] matrix in ~0.6x the time at 1-2 rows
    # (loader._column_major); the tied head gets a copy, the embedding keeps its rows
    model = make_engine(checkpoints["qwen2"]).runner.model
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]  # type: ignore[union-attr]
    assert len(linears) == 1 + 4 * len(model.model.layers)  # type: ignore[union-attr]
    assert all(m.weight.t().is_contiguous() and not m.weight.is_contiguous() for m in linears)
    embedding = model.model.embed_tokens.weight  # type: ignore[union-attr]
    assert embedding.is_contiguous()
    assert torch.equal(model.lm_head.weight, embedding)  # type: ignore[union-attr]


def test_building_the_engine_imports_neither_the_compiler_nor_sympy() -> None:
    # Every scheduler start builds the model on the meta device. An op on a meta
    # tensor (an initial draw, the rotary table, Module.to_empty) runs torch's
    # Python reference, which imports torch._dynamo (1.2 s here) or sympy (0.4 s):
    # a scheduler restart's p50 went from ~3.0–3.6 s to ~2.2 s without them.
    code = (
        "import sys\n"
        "from rt.assets import default_model_path\n"
        "from rt.gpu import EngineConfig, EngineCore, SamplingParams\n"
        "core = EngineCore(EngineConfig(model_path=str(default_model_path())))\n"
        "core.add_request('a', list(range(3, 40)), SamplingParams(max_new_tokens=3, seed=1))\n"
        "while core.has_work:\n"
        "    core.step()\n"
        "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", "a start-up that imports them is slow"

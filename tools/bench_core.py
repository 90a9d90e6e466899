"""Offline throughput of the rt engine core against transformers, on the same checkpoint and prompts.

    python tools/bench_core.py            # ~25M-parameter Llama (+ rt/assets/default_model if present)
    python tools/bench_core.py --quick    # a small smoke run
    python tools/bench_core.py --json     # one JSON object on stdout

Workload: N requests (32) with prompt lengths uniform in [32, 160] and 64 new
tokens each (EOS ignored so every system generates the same count), float32, CPU.
Rows: transformers ``generate`` at batch 1, a padded static batch through
``generate``, transformers' continuous batching (``generate_batch``), the rt
engine core, the rt core with the null model (runtime overhead alone), and
batch-1 decode of the core against a bare loop over the same model's forward.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rt.gpu import EngineConfig, EngineCore, SamplingParams  # noqa: E402
from rt.gpu.forward_batch import ForwardBatch  # noqa: E402

DUMMY_25M = dict(
    vocab_size=8000,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)


def make_dummy_checkpoint(root: Path, quick: bool) -> Path:
    import transformers

    cfg: dict[str, Any] = dict(DUMMY_25M)
    if quick:
        cfg.update(hidden_size=128, intermediate_size=352, num_hidden_layers=2, vocab_size=2000)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    path = root / "dummy-llama"
    model.save_pretrained(path)
    return path


def make_prompts(n: int, vocab: int, lo: int, hi: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(42)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for length in lengths]


def timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def bench_hf(path: Path, prompts: list[list[int]], new: int, batch1_reqs: int) -> dict[str, float]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gen = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    out: dict[str, float] = {}
    with torch.no_grad():
        model.generate(
            torch.tensor([prompts[0][:8]]), max_new_tokens=2, do_sample=False, pad_token_id=0
        )

        def batch1() -> int:
            for p in prompts[:batch1_reqs]:
                model.generate(
                    torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), **gen
                )
            return batch1_reqs * new

        tokens, secs = timed(batch1)
        out["hf_generate_batch1"] = tokens / secs

        def static() -> int:
            width = max(len(p) for p in prompts)
            ids = torch.zeros(len(prompts), width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, p in enumerate(prompts):  # left padding
                ids[i, width - len(p) :] = torch.tensor(p)
                mask[i, width - len(p) :] = 1
            model.generate(ids, attention_mask=mask, **gen)
            return len(prompts) * new

        tokens, secs = timed(static)
        out["hf_generate_static_batch"] = tokens / secs

        def continuous() -> int:
            cfg = transformers.GenerationConfig(
                max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0
            )
            results = model.generate_batch(prompts, generation_config=cfg, progress_bar=False)
            return sum(len(r.generated_tokens) for r in results.values())

        try:
            tokens, secs = timed(continuous)
            out["hf_generate_batch_continuous"] = tokens / secs
        except Exception as err:  # report, do not hide, a transformers failure
            print(f"generate_batch failed: {err!r}", file=sys.stderr)
    return out


def bench_rt(
    path: Path, prompts: list[list[int]], new: int, load_format: str = "auto"
) -> tuple[float, int]:
    engine = EngineCore(
        EngineConfig(
            model_path=path,
            load_format=load_format,
            max_total_tokens=32768,
            max_running_requests=64,
        )
    )
    params = SamplingParams(temperature=0.0, max_new_tokens=new, ignore_eos=True)
    engine.add_request("warmup", prompts[0][:8], SamplingParams(temperature=0.0, max_new_tokens=2))
    while engine.has_work:
        engine.step()
    engine.flush_cache()
    tokens = steps = 0
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    while engine.has_work:
        out = engine.step()
        tokens += sum(len(o.token_ids) for o in out.outputs)
        steps += 1
    secs = time.perf_counter() - start
    engine.check_integrity()
    return tokens / secs, steps


def bench_batch1_decode(path: Path, prompt: list[int], new: int) -> dict[str, float]:
    """Median per-token time of the core at batch 1 against a bare loop over the same model forward.

    The two alternate token by token, so both see the same machine load.
    """
    engine = EngineCore(
        EngineConfig(model_path=path, max_total_tokens=4096, max_running_requests=4)
    )
    engine.add_request(
        "a", prompt, SamplingParams(temperature=0.0, max_new_tokens=new, ignore_eos=True)
    )
    engine.step()  # the prefill
    # bare loop: its own table row and slots (pages the engine's one request never reaches)
    row = engine.cache.table.num_rows - 1
    slots = torch.arange(2048, 2048 + len(prompt) + new)
    engine.cache.table.slots[row, : slots.shape[0]] = slots
    tok = torch.tensor([prompt[-1]])
    core, bare = [], []
    for i in range(new - 1):
        start = time.perf_counter()
        engine.step()
        core.append(time.perf_counter() - start)
        pos = len(prompt) + i
        batch = ForwardBatch(
            input_ids=tok,
            positions=torch.tensor([pos]),
            out_cache_loc=slots[pos : pos + 1],
            req_rows=torch.tensor([row]),
            prefix_lens=[pos],
            extend_lens=[1],
            sample_indices=torch.tensor([0]),
        )
        start = time.perf_counter()
        tok = engine.runner.forward(batch).argmax(-1)
        bare.append(time.perf_counter() - start)
    assert not engine.has_work
    core_ms, bare_ms = statistics.median(core) * 1e3, statistics.median(bare) * 1e3
    return {
        "rt_batch1_decode_ms": core_ms,
        "bare_forward_decode_ms": bare_ms,
        "batch1_overhead_ratio": core_ms / bare_ms,
    }


def bench_model(name: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    cfg = json.loads((path / "config.json").read_text())
    lo, hi = (32, 160) if not args.quick else (16, 48)
    prompts = make_prompts(args.requests, int(cfg["vocab_size"]), lo, hi)
    res: dict[str, Any] = {
        "model": name,
        "requests": len(prompts),
        "new_tokens": args.new_tokens,
        "prompt_tokens": sum(len(p) for p in prompts),
    }
    # best of --repeat runs: the machine may be shared, a slow run says little
    for _ in range(args.repeat):
        for key, value in bench_hf(path, prompts, args.new_tokens, args.batch1_requests).items():
            res[key] = max(res.get(key, 0.0), value)
        tok_s, res["rt_core_steps"] = bench_rt(path, prompts, args.new_tokens)
        res["rt_core"] = max(res.get("rt_core", 0.0), tok_s)
        null_tok_s, _ = bench_rt(path, prompts, args.new_tokens, load_format="null")
        res["rt_core_null_model"] = max(res.get("rt_core_null_model", 0.0), null_tok_s)
    res.update(bench_batch1_decode(path, prompts[0], args.new_tokens))
    if "hf_generate_batch_continuous" in res:
        res["ratio_vs_generate_batch"] = res["rt_core"] / res["hf_generate_batch_continuous"]
    res["ratio_vs_static_batch"] = res["rt_core"] / res["hf_generate_static_batch"]
    res["ratio_vs_batch1"] = res["rt_core"] / res["hf_generate_batch1"]
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny model, 8 requests, 16 new tokens"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument(
        "--batch1-requests", type=int, default=None, help="requests run through generate at batch 1"
    )
    parser.add_argument(
        "--repeat", type=int, default=2, help="throughput rows: best of this many runs"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for every system (1: stable on shared cores)",
    )
    parser.add_argument(
        "--model-path", type=Path, default=None, help="also bench this HF model directory"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.requests = args.requests or (8 if args.quick else 32)
    args.new_tokens = args.new_tokens or (16 if args.quick else 64)
    args.batch1_requests = args.batch1_requests or (2 if args.quick else 4)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        models = [
            (
                "dummy-llama-25M" if not args.quick else "dummy-llama-tiny",
                make_dummy_checkpoint(Path(tmp), args.quick),
            )
        ]
        default = REPO / "rt" / "assets" / "default_model"
        if (default / "config.json").is_file() and not args.quick:
            models.append(("default_model", default))
        if args.model_path is not None:
            models.append((args.model_path.name, args.model_path))
        for name, path in models:
            results.append(bench_model(name, path, args))
    if args.json:
        print(json.dumps({"threads": torch.get_num_threads(), "results": results}, indent=2))
        return
    for r in results:
        print(
            f"== {r['model']}: {r['requests']} requests, {r['prompt_tokens']} prompt tokens, {r['new_tokens']} new each"
        )
        for key, value in r.items():
            if isinstance(value, float):
                unit = "" if "ratio" in key or key.endswith("_ms") else " tok/s"
                print(f"  {key:32s} {value:10.2f}{unit}")


if __name__ == "__main__":
    main()

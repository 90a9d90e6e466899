"""tools/gpu_bench.py: its roofline arithmetic, the whole ``--smoke`` run on CPU
(a tiny model through rt and transformers), and its refusal to run on a
missing CUDA device. The GPU figures themselves come from running it on one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from toollib import load_tool

gb = load_tool("gpu_bench")


@pytest.mark.parametrize("shape", ["tiny", "1b", "8b"])
def test_weight_bytes_are_every_parameter_with_the_embedding_matrix_once(shape: str) -> None:
    from rt.gpu import ModelConfig
    from rt.gpu.models.llama import LlamaForCausalLM

    cfg = ModelConfig.from_dict(gb.SHAPES[shape])
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    params = sum(p.numel() for p in model.parameters())  # a tied matrix counts once
    if not cfg.tie_word_embeddings:
        params -= model.model.embed_tokens.weight.numel()  # a lookup reads one row
    assert gb.weight_bytes_read(cfg, torch.bfloat16) == 2 * params
    if shape == "1b":
        assert 2.4e9 < gb.weight_bytes_read(cfg, torch.bfloat16) < 2.5e9  # 1.24B params


def test_the_roofline_divides_bandwidth_by_weights_and_the_batchs_kv() -> None:
    roof = gb.Roofline(bandwidth=1000.0, weight_bytes=100, kv_bytes_per_token=2)
    assert roof.limit(1, 0) == 10.0
    assert roof.limit(4, 25) == pytest.approx(4 * 1000 / (100 + 4 * 25 * 2))


def test_backend_variants_turn_engine_options_off_or_on() -> None:
    assert gb._split_backend("triton") == ("triton", {})
    assert gb._split_backend("triton-eager") == ("triton", {"cuda_graph": False})
    assert gb._split_backend("triton-eager-sync") == (
        "triton",
        {"cuda_graph": False, "overlap_schedule": False},
    )
    assert gb._split_backend("triton-deterministic") == ("triton", {"deterministic": True})


def test_smoke_reports_every_workload_with_positive_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report_path = tmp_path / "report.json"
    assert gb.main(["--smoke", "--json", str(report_path)]) == 0
    table = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    assert report["copy_bandwidth_bytes_per_s"] > 0
    rows = {(r["workload"], r["backend"]): r for r in report["rows"]}
    expected = [
        *[(f"decode b{b}", backend) for b in (1, 8, 64) for backend in ("torch", "transformers")],
        ("prefill 256", "torch"),
        ("prefill 256", "transformers"),
        ("offline 8x8", "torch"),
        ("offline 16x8", "torch"),
        ("roofline b1", "-"),
        ("roofline b8", "-"),
        ("roofline b64", "-"),
    ]
    for key in expected:
        assert key in rows, f"no {key} row in {sorted(rows)}"
        assert rows[key]["tok_s"] > 0, rows[key]
        assert f"| tiny {key[0]} | {key[1]} |" in table
    for batch in (1, 8, 64):  # decode is measured against its roofline
        assert 0 < rows[(f"decode b{batch}", "torch")]["pct_of_limit"] < 100
    assert rows[("offline 16x8", "torch")]["extra"]["retractions"] >= 0
    assert table.splitlines()[1].startswith("| workload | backend | tok/s | % of limit |")


@pytest.mark.parametrize("backend", ["no-such", "flashinfer"])  # flashinfer: CUDA only
def test_an_unavailable_backend_is_a_row_not_a_crash(backend: str) -> None:
    plan = gb.Plan(device="cpu", dtype="float32", shapes=("tiny",), backends=(backend,))
    cfg = gb.ModelConfig.from_dict(gb.SHAPES["tiny"])
    roof = gb.Roofline(1e9, 1, 1)
    [row] = gb.bench_rt("tiny", cfg, backend, plan, roof)
    assert row.tok_s is None and row.note.startswith("unavailable: ")
    assert f"| tiny all | {backend} | unavailable: " in gb.format_table([row])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_device_exits_2_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert gb.main(["--device", "cuda", "--shapes", "1b"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda but torch" in err and "sees no CUDA device" in err

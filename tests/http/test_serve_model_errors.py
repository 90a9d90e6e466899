"""A model directory rt cannot serve: one line that names the problem and exit 2,
from rt-serve (and a ConfigError from rt.open_engine), not a traceback, nor an
actor restarted until the supervisor gives up."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import rt
from rt.serve import main

Edit = Callable[[dict[str, Any]], Any]


def _without(key: str) -> Edit:
    return lambda config: {k: v for k, v in config.items() if k != key}


CONFIGS: dict[str, tuple[Edit, str]] = {
    "a list": (lambda config: [], "expected a JSON object, got list"),
    "no vocab_size": (_without("vocab_size"), "vocab_size: expected a positive integer"),
    "vocab_size null": (
        lambda config: {**config, "vocab_size": None},
        "vocab_size: expected a positive integer, got None",
    ),
    "heads": (
        lambda config: {**config, "num_attention_heads": 4, "num_key_value_heads": 3},
        "num_attention_heads (4) must be a multiple of num_key_value_heads (3)",
    ),
    "architecture": (
        lambda config: {**config, "architectures": ["GPT2LMHeadModel"]},
        "architecture 'GPT2LMHeadModel' is not supported",
    ),
    "no hidden_size": (_without("hidden_size"), "lacks the required field 'hidden_size'"),
}


def copy_of(tiny_model: Path, to: Path, edit: Edit) -> Path:
    shutil.copytree(tiny_model, to)
    config = json.loads((to / "config.json").read_text())
    (to / "config.json").write_text(json.dumps(edit(config)))
    return to


@pytest.mark.parametrize("case", CONFIGS)
async def test_a_config_json_rt_cannot_build_from_is_a_line(
    tiny_model: Path, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each was a traceback and exit 1 (or a scheduler started six times)."""
    edit, says = CONFIGS[case]
    path = copy_of(tiny_model, tmp_path / "model", edit)
    with pytest.raises(SystemExit) as exit_:
        main(["--model-path", str(path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    with pytest.raises(rt.errors.ConfigError, match="model_path: "):  # before any process
        async with rt.open_engine(str(path), device="cpu", torch_threads=1):
            pytest.fail("the engine started")


def _truncated(path: Path) -> str:
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return "SafetensorError"


def _rope_lacking_a_key(path: Path) -> str:
    config = json.loads((path / "config.json").read_text())
    rope = {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 128}
    config = {k: v for k, v in config.items() if k not in ("rope_scaling", "rope_parameters")}
    (path / "config.json").write_text(json.dumps({**config, "rope_parameters": rope}))
    return "low_freq_factor"


@pytest.mark.parametrize("spoil", [_truncated, _rope_lacking_a_key], ids=["truncated", "rope"])
def test_a_model_that_does_not_load_is_exit_2_after_one_start(
    tiny_model: Path, tmp_path: Path, spoil: Callable[[Path], str]
) -> None:
    """Found only as the scheduler loads the weights: it was started again six
    times (each a whole load of a real model) until the supervisor gave up, exit
    3, its last line the same error six times over."""
    path = tmp_path / "model"
    shutil.copytree(tiny_model, path)
    says = spoil(path)
    proc = subprocess.run(
        [sys.executable, "-m", "rt.serve", "--port", "0", "--model-path", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = [x for x in proc.stderr.splitlines() if "could not start" in x]
    assert says in line and f"cannot load the model in {path}" in line, line
    assert line.count(says) == 1  # (once: not once per start)
    assert "restarting" not in proc.stderr and "ready on" not in proc.stderr


def test_a_generation_config_no_request_could_take_is_a_line(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ConfigError too, but raised as the engine opened: it exited 1, after the
    actors had started (now 2, before any starts)."""
    path = copy_of(tiny_model, tmp_path / "model", lambda config: config)
    (path / "generation_config.json").write_text(json.dumps({"top_p": 0}))
    with pytest.raises(SystemExit) as exit_:
        main(["--model-path", str(path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "generation_config.json: top_p" in err and "--sampling-defaults" in err, err

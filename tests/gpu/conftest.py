"""Session fixtures for tests/gpu: one tiny random checkpoint per architecture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_testlib import ARCHS, make_checkpoint


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {arch: make_checkpoint(arch, root / arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def hf_models(checkpoints: dict[str, Path]) -> dict[str, Any]:
    import transformers

    return {
        arch: transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for arch, path in checkpoints.items()
    }

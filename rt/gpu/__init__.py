"""The engine core: model loading, model code, paged KV, radix cache, scheduling, sampling.

A synchronous library (``EngineCore.add_request`` / ``step`` / ``abort``) that
runs and is tested without actors or rings; it never imports trio. See
docs/architecture.md for its role.

The names below are imported on first use: ``rt.gpu.sampling_params`` is
needed by processes that never run a model (the frontend, the tokenizer
workers), and importing the engine would cost them torch's start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rt.gpu.engine import EngineCore, EngineStats
    from rt.gpu.engine_config import EngineConfig
    from rt.gpu.model_config import ModelConfig
    from rt.gpu.request import ReqOutput, StepOutput
    from rt.gpu.sampling_params import SamplingParams

_LAZY = {
    "EngineCore": "rt.gpu.engine",
    "EngineStats": "rt.gpu.engine",
    "EngineConfig": "rt.gpu.engine_config",
    "ModelConfig": "rt.gpu.model_config",
    "ReqOutput": "rt.gpu.request",
    "StepOutput": "rt.gpu.request",
    "SamplingParams": "rt.gpu.sampling_params",
}

__all__ = [
    "EngineConfig",
    "EngineCore",
    "EngineStats",
    "ModelConfig",
    "ReqOutput",
    "SamplingParams",
    "StepOutput",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rt.gpu' has no attribute {name!r}")

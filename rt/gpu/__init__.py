"""The engine core: model loading, model code, paged KV, radix cache, scheduling, sampling.

A synchronous library (``EngineCore.add_request`` / ``step`` / ``abort``) that
runs and is tested without actors or rings; it never imports trio. See
docs/architecture.md for its role.
"""

from __future__ import annotations

from rt.gpu.engine import EngineCore, EngineStats
from rt.gpu.engine_config import EngineConfig
from rt.gpu.model_config import ModelConfig
from rt.gpu.request import ReqOutput, StepOutput
from rt.gpu.sampling_params import SamplingParams

__all__ = [
    "EngineConfig",
    "EngineCore",
    "EngineStats",
    "ModelConfig",
    "ReqOutput",
    "SamplingParams",
    "StepOutput",
]

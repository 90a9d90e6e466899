"""Options of the engine core; names follow SGLang's server arguments where one exists."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rt.errors import ConfigError
from rt.gpu.model_config import ModelConfig

SCHEDULE_POLICIES = ("fcfs", "lpm", "priority")


@dataclass(frozen=True)
class EngineConfig:
    """How to build and run an engine core.

    ``model_path`` is a Hugging Face model directory. With ``load_format`` "dummy"
    (random weights) or "null" (no forward pass: fixed tokens, to measure the
    runtime's own overhead) a ``model_config`` may stand in for the directory.
    The KV pool holds ``max_total_tokens`` tokens, or ``mem_fraction`` of the
    memory free once the model is loaded (host memory on CPU) when that is None.
    """

    model_path: str | Path | None = None
    model_config: ModelConfig | None = None
    load_format: str = "auto"
    dtype: str = "float32"
    device: str = "cpu"
    # None: "triton" on CUDA or when deterministic, else "torch"
    attention_backend: str | None = None
    # batch-invariant kernels (fixed reduction orders and split sizes): a request's logits
    # depend neither on the rest of the batch nor on prefill vs decode of its prefix
    deterministic: bool = False
    page_size: int = 1
    max_total_tokens: int | None = None
    # None: 0.85 on CUDA (activations need little beside the pool; 256 requests of the
    # offline workload then fit without retractions), 0.5 of host memory on the CPU
    mem_fraction: float | None = None
    max_running_requests: int = 256
    max_prefill_tokens: int = 16384
    # the most prompt tokens one step prefills. None: 8192 on CUDA, 2048 on the CPU (where
    # a token costs far more: a bigger chunk holds every running request's next token
    # back for the whole step); -1: no chunking (SGLang's value for it)
    chunked_prefill_size: int | None = None
    schedule_policy: str = "fcfs"
    enable_prefix_cache: bool = True
    context_length: int | None = None
    # share of each running request's remaining token budget kept free when admitting;
    # raised to 1 after a retraction, then decays back
    new_token_ratio: float = 0.4
    new_token_ratio_decay: float = 0.002
    seed: int = 0
    # torch's intra-op threads in the process that runs the core (None: torch's default)
    torch_threads: int | None = None
    # launch step N + 1 before reading step N's tokens. None: on CUDA only (on the CPU
    # every op is synchronous: nothing would overlap)
    overlap_schedule: bool | None = None
    # replay captured CUDA graphs for decode batches of up to cuda_graph_max_bs requests.
    # None: wherever they can run (CUDA, the triton backend, not deterministic)
    cuda_graph: bool | None = None
    cuda_graph_max_bs: int = 256
    # run decode batches of up to torch_compile_max_bs requests through torch.compile
    # (inductor; the torch backend): compiled when the engine starts, ~10 s per size
    torch_compile: bool = False
    torch_compile_max_bs: int = 8

    @property
    def kv_mem_fraction(self) -> float:
        if self.mem_fraction is not None:
            return self.mem_fraction
        return 0.85 if self.device.startswith("cuda") else 0.5

    @property
    def prefill_chunk(self) -> int | None:
        """The chunk in effect (None: no chunking)."""
        if self.chunked_prefill_size is None:
            return 8192 if self.device.startswith("cuda") else 2048
        return None if self.chunked_prefill_size == -1 else self.chunked_prefill_size

    @property
    def backend(self) -> str:
        """The attention backend in effect."""
        if self.attention_backend is not None:
            return self.attention_backend
        # on CUDA the kernels (with CUDA graphs and overlap scheduling); on the CPU the
        # torch reference, which runs there without Triton's interpreter
        return "triton" if self.deterministic or self.device.startswith("cuda") else "torch"

    @property
    def use_overlap(self) -> bool:
        if self.overlap_schedule is not None:
            return self.overlap_schedule
        return self.device.startswith("cuda")

    @property
    def why_no_cuda_graph(self) -> str | None:
        """Why decode cannot replay CUDA graphs here (None: it can)."""
        if not self.device.startswith("cuda"):
            return f"they need a CUDA device, not {self.device!r}"
        if self.load_format == "null":
            return "the null model runs no forward pass"
        if self.backend != "triton":
            return f"they need attention_backend='triton', not {self.backend!r}"
        if self.deterministic:
            return "deterministic mode runs every step through the extend kernel"
        return None

    @property
    def why_no_torch_compile(self) -> str | None:
        """Why decode cannot run through torch.compile here (None: it can)."""
        if self.load_format == "null":
            return "the null model runs no forward pass"
        if self.device != "cpu":
            return f"it is for the CPU, not {self.device!r} (CUDA replays CUDA graphs)"
        if self.backend != "torch":
            return f"it needs attention_backend='torch', not {self.backend!r}"
        return None

    @property
    def use_cuda_graph(self) -> bool:
        return self.cuda_graph is not False and self.why_no_cuda_graph is None

    @property
    def graph_max_bs(self) -> int:
        """The largest decode batch a graph is captured for."""
        return min(self.cuda_graph_max_bs, self.max_running_requests)

    def __post_init__(self) -> None:
        if self.cuda_graph and self.why_no_cuda_graph is not None:
            raise ConfigError(
                f"cuda_graph=True: CUDA graphs cannot run here: {self.why_no_cuda_graph}"
            )
        if self.torch_compile and self.why_no_torch_compile is not None:
            raise ConfigError(f"torch_compile=True: {self.why_no_torch_compile}")
        if self.torch_compile_max_bs < 1:
            raise ConfigError(
                f"torch_compile_max_bs: expected an integer >= 1, got {self.torch_compile_max_bs}"
            )
        if self.cuda_graph_max_bs < 1:
            raise ConfigError(
                f"cuda_graph_max_bs: expected an integer >= 1, got {self.cuda_graph_max_bs}"
            )
        if self.deterministic and self.backend != "triton":
            raise ConfigError(
                f"deterministic inference needs attention_backend='triton' (its kernels have "
                f"fixed reduction orders), got {self.attention_backend!r}"
            )
        if self.model_path is None and self.model_config is None:
            raise ConfigError(
                "EngineConfig needs a model_path (a Hugging Face model directory) or a model_config"
            )
        if self.model_path is None and self.load_format not in ("dummy", "null"):
            raise ConfigError(
                f"load_format={self.load_format!r} needs a model_path; only 'dummy' and 'null' work without one"
            )
        if self.page_size < 1:
            raise ConfigError(f"page_size: expected an integer >= 1, got {self.page_size}")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ConfigError(
                f"schedule_policy={self.schedule_policy!r}; expected one of {SCHEDULE_POLICIES}"
            )
        if self.max_running_requests < 1 or self.max_prefill_tokens < 1:
            raise ConfigError("max_running_requests and max_prefill_tokens must be >= 1")
        if self.chunked_prefill_size is not None and not (
            self.chunked_prefill_size >= 1 or self.chunked_prefill_size == -1
        ):
            raise ConfigError(
                "chunked_prefill_size: expected None (the device's default), -1 (no chunking) "
                f"or >= 1, got {self.chunked_prefill_size}"
            )
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ConfigError(f"torch_threads: expected None or >= 1, got {self.torch_threads}")
        if self.mem_fraction is not None and not 0.0 < self.mem_fraction <= 1.0:
            raise ConfigError(f"mem_fraction: expected a number in (0, 1], got {self.mem_fraction}")

"""Every option of an engine, in one validated object.

Names follow SGLang's server arguments where one exists, so that ``rt-serve``
flags map onto these one for one. An unknown or out-of-range option is a
:class:`~rt.errors.ConfigError` that names it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from rt.actors.affinity import parse_cpu_list
from rt.errors import ConfigError, InvalidRequestError, ModelLoadError
from rt.gpu.sampling_params import SamplingParams

# what generation_config.json may set for requests that leave it out (vLLM's and SGLang's)
MODEL_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


# Bounds no engine reaches, so that a value past them is refused before any process
# starts (2**70 tokens or requests made the scheduler crash in a loop on torch's overflow)
MAX_TOKENS = 1 << 40
MAX_BATCH = 1 << 20


class EngineOptions(BaseModel):
    """How to build and run an engine (``rt.open_engine(**options)``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: str | None = Field(
        None, description="a Hugging Face model directory; None: the shipped default model"
    )
    tokenizer_path: str | None = Field(None, description="defaults to model_path")
    chat_template: str | None = Field(
        None,
        description="the chat template: a Jinja file's path, or the template itself; "
        "None: the tokenizer's own",
    )
    load_format: Literal["auto", "dummy", "null"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="auto: float32 on the CPU; on CUDA the checkpoint's bfloat16 or float16 "
        "(float16 for a float32 one), as SGLang and vLLM choose",
    )
    device: str = Field(
        "auto", description="auto: cuda if torch sees a CUDA device here, else cpu; or cpu, cuda:N"
    )
    context_length: int | None = Field(None, ge=1, le=MAX_TOKENS)
    # the scheduler
    max_total_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    mem_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="share of free memory for the KV pool; None: 0.85 on CUDA, 0.5 on the CPU",
    )
    page_size: int = Field(1, ge=1, le=MAX_BATCH)
    chunked_prefill_size: int | None = Field(
        None,
        ge=-1,
        le=MAX_TOKENS,
        description="the most prompt tokens one step prefills; None: 8192 on CUDA, 2048 on "
        "the CPU; -1: no chunking",
    )
    max_running_requests: int = Field(256, ge=1, le=MAX_BATCH)
    max_prefill_tokens: int = Field(16384, ge=1, le=MAX_TOKENS)
    schedule_policy: Literal["fcfs", "lpm", "priority"] = "fcfs"
    enable_prefix_cache: bool = True
    attention_backend: Literal["torch", "triton", "flashinfer"] | None = Field(
        None, description="None: triton on CUDA or when deterministic, else torch"
    )
    deterministic: bool = Field(
        False,
        description="batch-invariant kernels: a request's logits do not depend on the rest "
        "of the batch nor on whether its prefix came from prefill or decode",
    )
    seed: int = 0
    sampling_defaults: Literal["model", "openai"] = Field(
        "model",
        description="model: the sampling parameters a request leaves out take the values "
        "the model's generation_config.json sets (temperature, top_p, top_k, min_p, "
        "repetition_penalty), as vLLM and SGLang do; openai: the API's own (temperature 1, "
        "top_p 1, no top_k or min_p, repetition_penalty 1)",
    )
    # torch's intra-op threads in the scheduler (None: torch's default, one per core). On a
    # host whose cores other processes share, 1 avoids OpenMP threads waiting on each other
    # (docs/benchmarks.md: several times faster on a loaded 2-core machine)
    torch_threads: int | None = Field(None, ge=1, le=4096)
    scheduler_cpus: str | None = Field(
        None,
        description="pin the scheduler to these CPUs ('1', '2-7') and the engine's other "
        "processes to the rest of this process's CPUs; for a host the engine has to itself "
        "(None: no pinning). torch_threads then defaults to their number",
    )
    overlap_schedule: bool | None = Field(
        None,
        description="launch a step before reading the last one's tokens; None: on CUDA only",
    )
    cuda_graph: bool | None = Field(
        None,
        description="replay CUDA graphs for decode; None: wherever they can run (CUDA, the "
        "triton backend, not deterministic)",
    )
    cuda_graph_max_bs: int = Field(
        256, ge=1, le=MAX_BATCH, description="the largest decode batch captured"
    )
    torch_compile: bool = Field(
        False,
        description="run decode steps through torch.compile (the torch backend; compiled at "
        "start-up, ~10 s per batch size)",
    )
    torch_compile_max_bs: int = Field(
        8, ge=1, le=MAX_BATCH, description="the largest decode batch compiled"
    )
    # the tokenizer workers
    tokenizer_workers: int = Field(1, ge=1, le=64)
    tokenizer_batch_size: int = Field(64, ge=1, le=MAX_BATCH)
    tokenizer_batch_wait_ms: float = Field(2.0, ge=0)
    # supervision and recovery
    watchdog_timeout: float = Field(30.0, gt=0)
    shutdown_grace: float = Field(5.0, gt=0)
    max_restarts: int = Field(5, ge=0)
    restart_window: float = Field(60.0, gt=0)
    max_crashes_per_request: int = Field(3, ge=1)
    restart_wait_timeout: float = Field(
        60.0, gt=0, description="how long a new request waits for a restarting actor"
    )
    drain_timeout: float = Field(
        30.0,
        ge=0,
        description="on SIGTERM/SIGINT, how long requests in flight may take to finish "
        "before they are aborted and the engine stops",
    )
    stall_timeout: float = Field(
        10.0,
        ge=0,
        description="a request with no progress for this long is sent again (then after "
        "twice as long, …): a frame lost on its way would otherwise hang it; 0: never",
    )
    fault_plan: Any = Field(None, description="a FaultPlan, or a path to one (JSON or TOML)")
    ring_capacity: int = Field(1 << 22, ge=1 << 12)
    max_logprobs: int = Field(
        20,
        ge=0,
        description="the most top logprobs a request may ask for per token (vLLM's "
        "--max-logprobs): each costs the frontend memory per token of every sample",
    )

    @field_validator("chunked_prefill_size")
    @classmethod
    def _chunk(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("0 tokens a step would never prefill; -1 turns chunking off")
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        kind, _, index = value.partition(":")
        if kind not in ("auto", "cpu", "cuda") or (
            index and (kind != "cuda" or not index.isdigit())
        ):
            raise ValueError("expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
        return value

    @model_validator(mode="after")
    def _backend_on_device(self) -> EngineOptions:
        if self.attention_backend == "flashinfer" and self.device == "cpu":
            raise ValueError(
                "attention_backend 'flashinfer' runs on CUDA only, and the device is the CPU "
                "(device 'auto' is the CPU where torch sees no GPU); there: 'torch' or 'triton'"
            )
        return self

    def check_tokenizer(self) -> None:
        """That the tokenizer's ids fit the model's embeddings (read from its
        tokenizer.json; one without is left to its actors)."""
        folder = Path(self.resolved_tokenizer_path())
        if not folder.is_dir():
            raise ConfigError(f"tokenizer_path: expected a tokenizer's directory, got {folder}")
        path = folder / "tokenizer.json"
        if not path.is_file():
            return
        from tokenizers import Tokenizer

        try:
            size = Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)
        except Exception as err:
            raise ConfigError(f"tokenizer_path: {path} does not load ({err})") from err
        _, vocab = self.model_limits()
        if size > vocab:
            raise ConfigError(
                f"tokenizer_path: the tokenizer has {size} tokens, more than the model's "
                f"vocab_size ({vocab}): it is not this model's tokenizer"
            )

    def chat_template_text(self) -> str | None:
        """The chat template asked for, read from its file (text with ``{{`` or
        ``{%`` is the template itself) and compiled; None: the tokenizer's own. A
        ConfigError for a file that cannot be read or a template Jinja cannot compile."""
        given = self.chat_template
        if given is None:
            return None
        text = given
        if "{{" not in given and "{%" not in given:
            try:
                text = Path(given).read_text()
            except (OSError, UnicodeDecodeError) as err:
                raise ConfigError(
                    f"chat_template: expected a Jinja template or a file holding one; "
                    f"{given!r} cannot be read ({err})"
                ) from None
        import jinja2
        from transformers.utils import chat_template_utils

        # (transformers' own compiler knows its {% generation %} tag; plain Jinja else)
        compile_ = getattr(chat_template_utils, "_compile_jinja_template", None)
        try:
            if compile_ is not None:
                compile_(text)
            else:
                jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(text)
        except jinja2.TemplateSyntaxError as err:
            raise ConfigError(
                f"chat_template: Jinja cannot compile it: {err} (line {err.lineno})"
            ) from None
        return text

    def check_device(self) -> None:
        """That this host has the device asked for (imports torch)."""
        if not self.device.startswith("cuda"):
            return
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(self.device.partition(":")[2] or 0)
        if index >= count:
            raise ConfigError(
                f"device: {self.device!r} asked for, but torch sees {count} CUDA device(s) "
                "here; use device 'cpu'" + (f" or 'cuda:0'…'cuda:{count - 1}'" if count else "")
            )

    @field_validator("fault_plan")
    @classmethod
    def _plan(cls, value: Any) -> Any:
        from rt.actors.faultplan import FaultPlan

        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if value is not None and not isinstance(value, str | FaultPlan):
            raise ValueError(f"expected a FaultPlan or a path to one, got {type(value).__name__}")
        return value

    @field_validator("scheduler_cpus")
    @classmethod
    def _cpu_list(cls, value: str | None) -> str | None:
        if value is not None:
            parse_cpu_list(value)  # a ConfigError is a ValueError: pydantic reports it
        return value

    @classmethod
    def build(cls, **options: Any) -> EngineOptions:
        """Validated options, with ``device`` and ``dtype`` 'auto' resolved."""
        try:
            return cls(**options).resolved()
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']} (got {e.get('input')!r})"
                if e["loc"]
                else e["msg"].removeprefix("Value error, ")  # about several options
                for e in err.errors()
            )
            raise ConfigError(f"invalid engine options: {problems}") from err

    def resolved(self) -> EngineOptions:
        """These options with ``device`` and ``dtype`` 'auto' made what they stand for
        here (device 'auto' imports torch, to ask for CUDA), and validated as such."""
        device, dtype = self.device, self.dtype
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "float32" if device == "cpu" else self.checkpoint_dtype()
        if (device, dtype) == (self.device, self.dtype):
            return self
        return self.model_validate({**dict(self), "device": device, "dtype": dtype})

    def checkpoint_dtype(self) -> Literal["bfloat16", "float16"]:
        """What 'auto' runs the model in on a GPU: its checkpoint's bfloat16, or float16
        for a float16 or float32 one (config.json's ``dtype`` or ``torch_dtype``)."""
        config = self._checkpoint_config()
        saved = config.get("dtype") or config.get("torch_dtype")
        return "bfloat16" if saved == "bfloat16" else "float16"

    def resolved_model_path(self) -> str:
        if self.model_path is not None:
            return self.model_path
        from rt.assets import default_model_path

        return str(default_model_path())

    def resolved_tokenizer_path(self) -> str:
        return self.tokenizer_path or self.resolved_model_path()

    def _checkpoint_config(self) -> dict[str, Any]:
        path = Path(self.resolved_model_path()) / "config.json"
        try:
            config: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError as err:
            raise ConfigError(f"model_path: no config.json in {path.parent}") from err
        except NotADirectoryError as err:
            raise ConfigError(f"model_path: {path.parent} is not a directory") from err
        except (OSError, ValueError) as err:  # unreadable, or no JSON
            raise ConfigError(f"model_path: cannot read {path}: {err}") from err
        if not isinstance(config, dict):
            raise ConfigError(
                f"model_path: {path}: expected a JSON object, got {type(config).__name__}"
            )
        return config

    def check_model_dir(self) -> None:
        """That the model's directory describes a model rt can build: config.json's
        architecture and shapes, generation_config.json, the tokenizer's EOS (what
        the scheduler reads before the weights). A ConfigError names what is wrong:
        refused here, before any process starts, not by an actor at each restart."""
        from rt.gpu.model_dir import read_model_dir

        self._checkpoint_config()  # (no directory, or no config.json: said as everywhere)
        try:
            read_model_dir(self.resolved_model_path())
        except ModelLoadError as err:
            raise ConfigError(f"model_path: {err}") from err

    def model_sampling_defaults(self) -> dict[str, Any]:
        """What generation_config.json sets of ``MODEL_SAMPLING_KEYS`` (none with
        ``sampling_defaults="openai"``). A ConfigError if a request could not take them:
        each would be refused for a value it never sent."""
        path = Path(self.resolved_model_path()) / "generation_config.json"
        if self.sampling_defaults == "openai" or not path.is_file():
            return {}
        try:
            gen = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"{path} is not valid JSON: {err}") from err
        if not isinstance(gen, dict):
            raise ConfigError(f"{path}: expected a JSON object, got {type(gen).__name__}")
        defaults = {k: gen[k] for k in MODEL_SAMPLING_KEYS if gen.get(k) is not None}
        try:
            SamplingParams(**defaults).validate(self.model_limits()[1])
        except InvalidRequestError as err:
            raise ConfigError(
                f"{path}: {err} (sampling_defaults='openai', rt-serve's --sampling-defaults "
                "openai, leaves it unread)"
            ) from err
        return defaults

    def model_limits(self) -> tuple[int, int]:
        """(context length, vocabulary size) from the model's config.json."""
        config = self._checkpoint_config()
        trained, vocab = config.get("max_position_embeddings"), config.get("vocab_size")
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
            raise ConfigError(
                f"model_path: config.json's vocab_size: expected a positive integer, got {vocab!r}"
            )
        if trained is not None and (isinstance(trained, bool) or not isinstance(trained, int)):
            raise ConfigError(
                "model_path: config.json's max_position_embeddings: expected an integer, "
                f"got {trained!r}"
            )
        if self.context_length and trained is not None and self.context_length > trained:
            raise ConfigError(
                f"context_length: expected at most the model's max_position_embeddings "
                f"({trained}), got {self.context_length}; positions past it were never "
                "trained, and what the model makes of them is garbage"
            )
        # (none in config.json: 4096, as the engine core takes it: rt.gpu.model_config)
        return self.context_length or trained or 4096, vocab

    def _scheduler_threads(self) -> int | None:
        """One torch thread per CPU the scheduler is pinned to."""
        return None if self.scheduler_cpus is None else len(parse_cpu_list(self.scheduler_cpus))

    def engine_config(self) -> Any:
        """The engine core's configuration (imported lazily: it pulls in torch)."""
        from rt.gpu.engine_config import EngineConfig

        if "auto" in (self.device, self.dtype):  # (built without build())
            return self.resolved().engine_config()
        return EngineConfig(
            model_path=self.resolved_model_path(),
            load_format=self.load_format,
            dtype=self.dtype,
            device=self.device,
            attention_backend=self.attention_backend,
            deterministic=self.deterministic,
            page_size=self.page_size,
            max_total_tokens=self.max_total_tokens,
            mem_fraction=self.mem_fraction,
            max_running_requests=self.max_running_requests,
            max_prefill_tokens=self.max_prefill_tokens,
            chunked_prefill_size=self.chunked_prefill_size,
            schedule_policy=self.schedule_policy,
            enable_prefix_cache=self.enable_prefix_cache,
            context_length=self.context_length,
            seed=self.seed,
            torch_threads=self.torch_threads or self._scheduler_threads(),
            overlap_schedule=self.overlap_schedule,
            cuda_graph=self.cuda_graph,
            cuda_graph_max_bs=self.cuda_graph_max_bs,
            torch_compile=self.torch_compile,
            torch_compile_max_bs=self.torch_compile_max_bs,
        )

"""Triton kernels, each with its torch reference and launcher.

Each module holds a torch reference (``*_ref``), the ``@triton.jit`` kernel and
a launcher that checks shapes, strides and dtypes. Without CUDA the kernels run
under Triton's interpreter (``TRITON_INTERPRET=1``): that is how CI tests them,
on the CPU. The variable is read when a kernel is decorated, so it is set here,
before any kernel module is imported.
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    if "triton.language" in sys.modules:
        # its own @jit helpers (tl.sum's combine function, …) were then built for a GPU,
        # and the interpreter fails inside every kernel that uses them
        raise ImportError(
            "triton was imported (by transformers' model code, say) before rt's kernels could "
            "select its interpreter: set TRITON_INTERPRET=1 in the environment, or import "
            "kernels first"
        )
    os.environ["TRITON_INTERPRET"] = "1"
# multiply-adds fused (Triton's default so far); said explicitly, since Triton 3.9 warns
# that its default will change, and a warning is an error in the test suite
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def interpreted() -> bool:
    """Whether the kernels run under Triton's interpreter (on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def device_type() -> str:
    """The device the kernels take tensors on in this process: 'cpu' under the
    interpreter, else 'cuda' (they were compiled for the GPU)."""
    return "cpu" if interpreted() else "cuda"


def why_not_on(device: torch.device | str) -> str | None:
    """Why the kernels cannot run on ``device``'s tensors in this process (None: they can).
    The interpreter is chosen once, when this package is first imported: without CUDA
    (or with TRITON_INTERPRET=1 set before) the kernels take CPU tensors, else CUDA ones."""
    kind = torch.device(device).type
    if kind == device_type():
        return None
    if kind == "cpu":
        return (
            "on a machine with CUDA the kernels are compiled for the GPU, and CPU tensors "
            "need Triton's interpreter (TRITON_INTERPRET=1 in the environment before the "
            "process starts): use device 'cuda', or attention_backend 'torch' on the CPU"
        )
    return f"the kernels run under Triton's interpreter here, on CPU tensors, not {kind!r} ones"

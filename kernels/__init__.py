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

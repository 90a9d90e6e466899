"""What the rings assume of the CPU, and the refusal to run where it does not hold.

The rings are lock-free between processes and written in Python, which has no
atomics or fences of its own. They rely on x86-64's memory model (TSO):

* a store is not reordered with older stores, so "write the frame's bytes,
  then store ``head``" publishes the frame (and "read it, then store
  ``tail``" frees its space);
* an aligned 8-byte store (``memoryview.cast('Q')[i] = v``) is one store,
  never torn;
* a locked instruction is a full barrier, so a lock's acquire and release
  (:func:`fence`) orders a store before a later load, which the doorbell
  protocol needs ("set sleeping, then re-check"; "publish, then look at the
  peer's flag").

On aarch64, POWER or RISC-V the first and last do not hold (stores reach
other cores out of order; an uncontended lock is not a store→load fence):
a consumer could see ``head`` before the frame's bytes and read a torn or
stale frame, and a wake-up could be lost. A 32-bit interpreter may split an
8-byte store in two. So rings refuse to be created or attached anywhere
but a 64-bit interpreter on x86-64, with :class:`~rt.errors.ConfigError`.
"""

from __future__ import annotations

import platform
import sys
import threading

from rt.errors import ConfigError

X86_64 = frozenset({"x86_64", "amd64"})

# Acquiring a lock is a locked instruction on x86: a full barrier, which
# orders an earlier store before a later load (plain TSO does not). Hot
# paths inline `fence_acquire(); fence_release()` (75 ns; `with FENCE: pass`
# costs 160 ns).
FENCE = threading.Lock()
fence_acquire, fence_release = FENCE.acquire, FENCE.release


def fence() -> None:
    """A full memory barrier on x86-64 (see FENCE)."""
    fence_acquire()
    fence_release()


def machine() -> str:
    """The CPU architecture this process runs on, as the kernel names it."""
    return platform.machine()


def interpreter_bits() -> int:
    return 64 if sys.maxsize > 2**32 else 32


def check_memory_order() -> None:
    """Raise ConfigError unless the rings' memory-ordering assumptions hold here."""
    arch = machine()
    if arch.lower() not in X86_64:
        raise ConfigError(
            f"rt's shared-memory rings need an x86-64 CPU, and this one is {arch!r}: they "
            "publish frames with plain stores and rely on x86-64's store order (TSO) and "
            "on a lock as a full fence, which do not hold here (frames could be read torn "
            "or stale and wake-ups lost). Run rt on an x86-64 host (or an x86-64 container "
            "under emulation); support for other CPUs needs real atomics in rt/shm"
        )
    if interpreter_bits() != 64:
        raise ConfigError(
            "rt's shared-memory rings need a 64-bit Python: a 32-bit interpreter may split "
            "the rings' 8-byte counter stores in two, and a peer could read a torn counter. "
            "Use a 64-bit (x86-64) Python build"
        )

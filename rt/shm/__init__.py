"""Lock-free single-producer single-consumer rings over POSIX shared memory.

The supervisor creates a :class:`Ring` (segment + doorbells) and hands its
``spec`` and ``fds`` to the processes at either end, which attach a
:class:`RingSender` or a :class:`RingReceiver`. Frames stay in the ring until
the receiver commits them, so a restarted receiver gets again every frame its
predecessor had not committed. See docs/architecture.md.
"""

from __future__ import annotations

from rt.shm import codec
from rt.shm.channel import RingReceiver, RingSender
from rt.shm.doorbell import Doorbell
from rt.shm.fanin import FanInReceiver
from rt.shm.ring import Frame, Ring, RingSpec, RingStatistics
from rt.shm.segment import new_run_prefix, sweep

__all__ = [
    "Doorbell",
    "FanInReceiver",
    "Frame",
    "Ring",
    "RingReceiver",
    "RingSender",
    "RingSpec",
    "RingStatistics",
    "codec",
    "new_run_prefix",
    "sweep",
]

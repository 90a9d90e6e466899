"""An eventfd that one process rings and another waits on.

The fd is created non-blocking and close-on-exec; a supervisor hands it to
every child (and to a restarted child) through ``subprocess``'s ``pass_fds``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Doorbell:
    """A doorbell is just its fd number; it crosses process boundaries by inheritance."""

    fd: int

    @classmethod
    def create(cls) -> Doorbell:
        return cls(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))

    def ring(self) -> None:
        try:
            os.eventfd_write(self.fd, 1)
        except BlockingIOError:  # the counter is saturated: a wake is pending anyway
            pass

    def drain(self) -> None:
        """Reset the counter so the next wait sleeps until the next ring."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

"""Rings refuse to exist where their memory-ordering assumptions do not hold
(the check is forced by patching what it reads of the machine)."""

from __future__ import annotations

import pytest

from rt.errors import ConfigError
from rt.shm import Ring, RingReceiver, RingSender, memory_order, new_run_prefix


@pytest.mark.parametrize("arch", ["aarch64", "arm64", "ppc64le", "riscv64", "i686"])
def test_a_ring_is_refused_off_x86_64(monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    monkeypatch.setattr(memory_order, "machine", lambda: arch)
    with pytest.raises(ConfigError, match=f"need an x86-64 CPU, and this one is '{arch}'"):
        Ring.create(new_run_prefix(), "refused", capacity=4096)


def test_attaching_is_refused_off_x86_64_too(monkeypatch: pytest.MonkeyPatch) -> None:
    with Ring.create(new_run_prefix(), "made-on-x86", capacity=4096) as ring:
        monkeypatch.setattr(memory_order, "machine", lambda: "aarch64")
        for endpoint in (RingSender, RingReceiver):
            with pytest.raises(ConfigError, match="Run rt on an x86-64 host"):
                endpoint.attach(ring.spec)


def test_a_32_bit_interpreter_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_order, "interpreter_bits", lambda: 32)
    with pytest.raises(ConfigError, match="64-bit Python"):
        Ring.create(new_run_prefix(), "refused", capacity=4096)


@pytest.mark.parametrize("arch", ["x86_64", "AMD64"])
def test_x86_64_is_accepted(monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    monkeypatch.setattr(memory_order, "machine", lambda: arch)
    with Ring.create(new_run_prefix(), "accepted", capacity=4096) as ring:
        RingSender.attach(ring.spec).close()

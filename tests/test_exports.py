"""The public surface: what `rt` and its layers export, pinned."""

from __future__ import annotations

import rt
import rt.errors
import rt.shm


def test_rt_shm_exports() -> None:
    assert sorted(rt.shm.__all__) == [
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
    for name in rt.shm.__all__:
        assert getattr(rt.shm, name) is not None


def test_every_error_descends_from_rt_error() -> None:
    errors = [
        obj
        for obj in vars(rt.errors).values()
        if isinstance(obj, type) and issubclass(obj, BaseException)
    ]
    assert len(errors) > 10
    for err in errors:
        assert issubclass(err, rt.errors.RtError), err


def test_errors_docstring_draws_every_class() -> None:
    doc = rt.errors.__doc__ or ""
    for name, obj in vars(rt.errors).items():
        if (
            isinstance(obj, type)
            and issubclass(obj, rt.errors.RtError)
            and obj is not rt.errors.RtError
        ):
            assert name in doc, f"{name} is missing from the tree in rt/errors.py"


def test_rt_shm_never_imports_torch() -> None:
    import subprocess
    import sys

    code = "import sys, rt.shm; from rt.shm import codec; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0

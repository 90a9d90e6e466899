"""tools/fault_run.py is a thin wrapper: its options become rt-chaos's."""

from __future__ import annotations

from toollib import load_tool


def test_its_options_become_rt_chaos_options() -> None:
    module = load_tool("fault_run")
    argv = module.translate(
        ["--requests", "50", "--seed", "4", "--kills", "2", "--json", "--hogs", "1"]
    )
    assert argv[:5] == [
        "--in-process",
        "--requests=50",
        "--seed=4",
        "--fault-count=6",
        "--kinds=sigkill",
    ]
    assert "--json" in argv and argv[-2:] == ["--hogs", "1"]

    from rt.chaos.cli import build_parser, configure

    config = configure(build_parser().parse_args(argv))
    assert config.run.mode == "engine" and config.schedule.kinds == ("sigkill",)
    assert config.schedule.poison == 0 and config.run.hogs == 1

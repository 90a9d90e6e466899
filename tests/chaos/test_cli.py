"""rt-chaos's options become a campaign's configuration."""

from __future__ import annotations

import argparse

import pytest

from rt.chaos.cli import UsageError, build_parser, configure, duration


def config(*argv: str):  # type: ignore[no-untyped-def]
    return configure(build_parser().parse_args(list(argv)))


def test_durations() -> None:
    assert duration("90s") == 90 and duration("10m") == 600 and duration("1.5h") == 5400
    assert duration("45") == 45
    with pytest.raises(argparse.ArgumentTypeError):
        duration("ten minutes")


def test_defaults_start_rt_serve_with_sse_and_websocket_load() -> None:
    c = config()
    assert c.run.mode == "server" and c.run.workload.transports == ("sse", "ws")
    assert c.run.requests == 60 and c.run.concurrency == 8
    assert c.schedule.faults == 12 and c.schedule.poison == 3
    assert c.run.engine["max_restarts"] >= c.schedule.faults
    assert c.run.until_faults  # a count goes on until the signal faults were tried
    assert not config("--no-until-faults").run.until_faults


def test_max_restarts_0_is_taken() -> None:
    """0 was taken for none given: the default, a restart per fault and more."""
    assert config("--max-restarts", "0").run.engine["max_restarts"] == 0
    assert config("--tokenizer-workers", "2", "--actors", "tokenizer1").schedule.actors == (
        "tokenizer1",
    )


def test_in_process_attach_and_duration() -> None:
    assert config("--in-process").run.workload.transports == ("engine",)
    attached = config("--url", "http://127.0.0.1:1234", "--duration", "5m")
    assert attached.run.mode == "attach" and attached.run.requests is None
    assert attached.run.duration == 300 and "shutdown" not in attached.schedule.phases
    # no fault plan reaches a running server: signals only, no poison
    assert set(attached.schedule.kinds) == {"sigkill", "sigsegv", "sigstop"}
    assert attached.schedule.poison == 0 and attached.schedule.signal_share == 1.0
    # kinds asked for that no signal is: refused (they were replaced by the signals)
    url = ("--url", "http://127.0.0.1:1234")
    assert config(*url, "--kinds", "sigkill,drop").schedule.kinds == ("sigkill",)
    with pytest.raises(UsageError, match=r"only signals can be sent: .*got drop, delay"):
        config(*url, "--kinds", "drop,delay")


def test_bfloat16_runs_batched_with_the_prefix_cache_as_users_run_it() -> None:
    c = config("--dtype", "bfloat16")
    assert c.run.concurrency == 8 and "enable_prefix_cache" not in c.run.engine
    assert c.run.engine["dtype"] == "bfloat16"
    assert config("--dtype", "bfloat16", "--concurrency", "4").run.concurrency == 4


def test_output_lengths_and_the_backlog_phase() -> None:
    assert config().run.workload.max_tokens == (8, 40)
    assert config("--max-tokens", "150,250").run.workload.max_tokens == (150, 250)
    assert config("--max-tokens", "64").run.workload.max_tokens == (64, 64)
    for bad in ("0,5", "9,3", "1,2,3", "many"):
        with pytest.raises(SystemExit):
            config("--max-tokens", bad)
    assert config("--phases", "backlog").schedule.phases == ("backlog",)
    assert config().schedule.backlog_s == (0.02, 0.3)
    for bad in ("1,0.5", "-1,2", "a,b"):
        with pytest.raises(SystemExit):
            config("--backlog-s", bad)
    # the reader's stop before each backlog fault is drawn in the range asked for
    from rt.chaos.draw import draw_schedule

    c = config("--phases", "backlog", "--kinds", "sigkill", "--backlog-s", "0.5,1.5")
    stops = [f.stop_s for f in draw_schedule(3, c.schedule).faults if f.phase == "backlog"]
    assert stops and all(0.5 <= s <= 1.5 for s in stops)
    default = config("--phases", "backlog", "--kinds", "sigkill")
    stops = [f.stop_s for f in draw_schedule(3, default.schedule).faults if f.phase == "backlog"]
    assert stops and all(0.02 <= s <= 0.3 for s in stops)


def test_seeded_share_and_temperature() -> None:
    from rt.chaos.workload import draw_request

    w = config().run.workload
    assert (w.seeded_share, w.seeded_temperature) == (0.5, 0.8)
    hot = config("--seeded", "1", "--temperature", "1.2").run.workload
    specs = [draw_request(5, i, hot) for i in range(20)]
    assert all(s.temperature == 1.2 and s.seed is not None for s in specs)
    greedy = config("--seeded", "0").run.workload
    assert all(draw_request(5, i, greedy).temperature == 0.0 for i in range(20))
    for bad in (("--seeded", "1.5"), ("--temperature", "-1"), ("--seeded", "x")):
        with pytest.raises(SystemExit):
            config(*bad)


def test_replay_and_fault_subsets() -> None:
    c = config("--replay", "7", "--faults", "3,9", "--ring-capacity", "4096", "--hogs", "2")
    assert c.run.seed == 7 and c.only == (3, 9)
    assert c.run.engine["ring_capacity"] == 4096 and c.run.hogs == 2
    assert config("--faults", "none").only == ()
    with pytest.raises(SystemExit):
        config("--kinds", "sigkill,explode")


@pytest.mark.slow
def test_a_failing_run_exits_1_with_its_shortest_schedule(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """End to end through main(): two planned detokenizer crashes where rt
    allows one restart make the engine checker fail (an escalation); the
    exit status is 1 and --json carries the shrunk schedule: both faults,
    since either alone passes. Three more faults never fire: the shrink
    drops them first (one replay), so ddmin's budget goes to the two that
    matter (without the cut it ran out before proving them minimal)."""
    import json

    from rt.chaos.cli import main

    kill = {"kind": "sigkill", "actor": "detokenizer", "via": "plan", "phase": "frame",
            "point": "receive", "after": 2}  # fmt: skip
    never = {"kind": "sigkill", "actor": "tokenizer0", "via": "plan", "phase": "frame",
             "point": "receive", "after": 10**6}  # fmt: skip
    schedule = {"seed": 3, "faults": [kill | {"id": 0, "incarnation": 1},
                                      kill | {"id": 1, "incarnation": 2},
                                      *(never | {"id": i} for i in (2, 3, 4))]}  # fmt: skip
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps(schedule))
    argv = ["--in-process", "--load-format", "null", "--requests", "6", "--concurrency", "2",
            "--poison", "0", "--hostile", "0", "--cancel", "0", "--max-restarts", "1",
            "--schedule", str(path), "--shrink-budget", "4", "--log-dir", str(tmp_path),
            "--json", "--quiet", "--timeout", "60"]  # fmt: skip
    assert main(argv) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["passed"] and report["checks"]["engine"] == "FAIL"
    assert report["shrunk"]["ids"] == [0, 1] and report["shrunk"]["for"] == "engine"
    assert report["shrunk"]["replays"] == 4 and not report["shrunk"]["budget_ran_out"]
    replay = report["shrunk"]["replay"]  # (the run's command: its schedule, the faults kept)
    assert replay.startswith("rt-chaos --in-process") and replay.endswith("--faults 0,1"), replay
    assert f"--schedule {path}" in replay and "--replay" not in replay, replay


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--kinds="], "--kinds: none given"),  # (an empty deck: it drew for ever, silent)
        (["--actors="], "--actors: none given"),
        (["--actors", "bogus"], "unknown ['bogus']"),  # (a KeyError's traceback)
        (["--faults", "abc"], "--faults: expected ids"),  # (a ValueError's)
        (["--schedule", "/nonexistent.json"], "--schedule: /nonexistent.json is no schedule"),
        (["--concurrency", "-1"], "--concurrency: expected an integer >= 1"),  # (the engine
        (["--tokenizer-workers", "0"], "expected an integer >= 1"),  # "gave up": a FAIL)
        (["--ring-capacity", "10"], "invalid engine options: ring_capacity"),
        (["--hostile", "5"], "--hostile: expected a number in [0, 1]"),
        (["--timeout", "-1"], "--timeout: expected a number"),  # (every request "hung")
        (["--poison", "-2"], "--poison: expected an integer >= 0"),
        # (refused at the engine's start: "the engine gave up", an engine FAIL)
        (["--actors", "tokenizer1"], "--actors: tokenizer1: the engine runs 1 tokenizer worker"),
        (["--actors", "tokenizer01"], "unknown ['tokenizer01']"),
        (["--model-path", "/nonexistent"], "model_path: no config.json in /nonexistent"),
    ],
)
def test_a_command_line_that_cannot_run_exits_2_naming_what(  # type: ignore[no-untyped-def]
    argv: list[str], said: str, capsys
) -> None:
    """Before anything starts; each was a traceback, a silent hang, or a run that
    failed as the engine's fault (found by a review of the harness)."""
    from rt.chaos.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--in-process", "--load-format", "null", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err


def test_ctrl_c_ends_an_in_process_campaign_with_no_verdict(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """open_engine took the SIGINT (a drain): the load went on, each request refused,
    hundreds of findings, a false FAIL, then replays of the shrink that a second
    Ctrl-C could not stop. Now the campaign ends: exit 130, nothing left behind."""
    import signal
    import subprocess
    import sys
    import time

    argv = [sys.executable, "-m", "rt.chaos", "--in-process", "--load-format", "null",
            "--requests", "400", "--concurrency", "2", "--log-dir", str(tmp_path)]  # fmt: skip
    err_path = tmp_path / "err.txt"
    with err_path.open("w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 120
            ledger = tmp_path / "ledger-1.jsonl"
            while not ledger.exists() or '"ev": "delta"' not in ledger.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()
                time.sleep(0.2)  # (till the engine is up and tokens flow)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 130, err_path.read_text()[-3000:]
        finally:
            proc.kill()
            proc.wait()
    said = err_path.read_text()
    assert "rt-chaos: interrupted (SIGINT): no verdict" in said and "Traceback" not in said, said
    assert "shrink" not in said, said

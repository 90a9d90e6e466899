"""tools/bench_serving.py: its pure core (request generation, arrivals and
bodies, in tools/serving_requests.py; the figures) in microseconds, the load
driver on a mock clock, and the whole command once through rt's trio API with
the null model. (Its HTTP and WebSocket transports need a server: tests/http/
runs them against rt-serve.)"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from toollib import load_tool

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_serving.py"


bs = load_tool("bench_serving")
rq = sys.modules["serving_requests"]  # its pure requests, imported with it


def test_lengths_are_fixed_at_ratio_one_and_in_range_below() -> None:
    assert rq.sample_lengths(5, 64, 1.0, random.Random(0)) == [64] * 5
    lengths = rq.sample_lengths(1000, 100, 0.5, random.Random(0))
    assert min(lengths) == 50 and max(lengths) == 100
    assert lengths == rq.sample_lengths(1000, 100, 0.5, random.Random(0))
    with pytest.raises(ValueError, match="range_ratio"):
        rq.sample_lengths(1, 10, 0.0, random.Random(0))


def test_a_prompt_is_trimmed_until_it_encodes_within_its_length() -> None:
    # Id 100 decodes to two characters that encode as two tokens: a round trip
    # through a real tokenizer also changes the count (merges and splits).
    vocab = {i: chr(97 + i) for i in range(26)} | {100: "xy"}

    def decode(ids: list[int]) -> str:
        return "".join(vocab[i] for i in ids)

    def encode(text: str) -> list[int]:
        return [ord(c) - 97 for c in text]

    assert rq.fit_prompt([100, 100, 0], encode, decode) == ("xyx", 3)
    assert rq.fit_prompt([0, 1], encode, decode) == ("ab", 2)
    assert rq.fit_prompt([5, 6], lambda t: [0], decode) == ("fg", 1)  # shorter is kept


def test_requests_are_reproducible_and_within_the_lengths_asked() -> None:
    def decode(ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)

    def encode(text: str) -> list[int]:
        return [int(w[1:]) for w in text.split()]

    def make(seed: int) -> list[Any]:
        return rq.make_requests(20, 30, 10, 0.5, seed, range(3, 50), encode, decode)

    specs = make(1)
    assert specs == make(1) and specs != make(2)
    # a prompt seed of its own: other prompts, the same lengths (one run's, beside another's)
    own = rq.make_requests(20, 30, 10, 0.5, 1, range(3, 50), encode, decode, prompt_seed=9)
    assert [s.prompt for s in own] != [s.prompt for s in specs]
    assert [s.output_len for s in own] == [s.output_len for s in specs]
    assert [len(s.prompt.split()) for s in own] == [len(s.prompt.split()) for s in specs]
    assert all(15 <= s.prompt_len <= 30 and 5 <= s.output_len <= 10 for s in specs)
    assert all(s.prompt_len == len(encode(s.prompt)) for s in specs)
    assert all(min(encode(s.prompt)) >= 3 for s in specs)  # only ids of the vocab given


def test_arrivals_are_a_poisson_process_or_all_at_once() -> None:
    assert rq.arrival_offsets(3, math.inf, random.Random(0)) == [0.0, 0.0, 0.0]
    offsets = rq.arrival_offsets(20_000, 50.0, random.Random(0))
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert offsets[0] == 0.0 and min(gaps) >= 0
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 50, rel=0.03)
    # exponential gaps: the standard deviation equals the mean
    mean = sum(gaps) / len(gaps)
    std = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps))
    assert std == pytest.approx(mean, rel=0.05)
    with pytest.raises(ValueError, match="rate must be > 0"):
        rq.arrival_offsets(1, 0.0, random.Random(0))


def test_each_flavor_asks_for_exact_lengths_its_own_way() -> None:
    spec = rq.RequestSpec("hello", 1, 7)
    rt_body = rq.completion_body("rt", "m", spec, {})
    assert rt_body == {
        "prompt": "hello",
        "max_tokens": 7,
        "stream": True,
        "model": "m",
        "temperature": 0.0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    tf = rq.completion_body("transformers", None, spec, {"seed": 3})
    assert "model" not in tf and "ignore_eos" not in tf and tf["seed"] == 3
    assert json.loads(tf["generation_config"]) == {
        "max_new_tokens": 7,
        "min_new_tokens": 7,
        "do_sample": False,
    }
    assert "ignore_eos" not in rq.completion_body("plain", "m", spec, {})
    with pytest.raises(ValueError, match="flavor"):
        rq.completion_body("vllm", "m", spec, {})


def test_sse_data_lines() -> None:
    assert rq.sse_data('data: {"a": 1}') == '{"a": 1}'
    assert rq.sse_data("data:[DONE]") == "[DONE]"
    assert rq.sse_data(": keep-alive") is None
    assert rq.sse_data("event: x") is None
    assert rq.sse_data("") is None


def test_a_record_times_first_token_and_gaps_between_chunks() -> None:
    record = bs.Record(prompt_tokens=3, start=10.0)
    for now in (10.5, 10.6, 10.9):
        record.chunk(now)
    record.finish(11.0)
    assert record.ttft == pytest.approx(0.5)
    assert record.itl == pytest.approx([0.1, 0.3])
    assert record.latency == pytest.approx(1.0)


def test_the_summary_counts_completed_requests_and_their_figures() -> None:
    def record(ttft: float, latency: float, tokens: int) -> object:
        return bs.Record(
            prompt_tokens=10, output_tokens=tokens, ttft=ttft, itl=[0.01] * (tokens - 1),
            latency=latency, step_to_client=[0.002], cached_tokens=tokens // 10,
        )  # fmt: skip

    failed = bs.Record(prompt_tokens=10, error="HTTP 503: overloaded")
    out = bs.summarize([record(0.1, 1.1, 11), record(0.3, 2.3, 21), failed], duration=4.0)
    assert (out["completed"], out["failed"]) == (2, 1)
    assert out["request_throughput"] == pytest.approx(0.5)
    assert out["input_throughput"] == pytest.approx(20 / 4)
    assert out["output_throughput"] == pytest.approx(32 / 4)
    assert out["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert out["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert out["tpot_ms"]["mean"] == pytest.approx(100.0)  # 1.0 s / 10 and 2.0 s / 20
    assert out["itl_ms"]["p99"] == pytest.approx(10.0)
    assert out["e2e_ms"]["p99"] == pytest.approx(2288.0)  # numpy's linear interpolation
    assert out["step_to_client_ms"]["p50"] == pytest.approx(2.0)
    assert out["errors"] == ["HTTP 503: overloaded"]
    assert out["cached_percent"] == pytest.approx(100 * 3 / 20)  # of the completed prompts
    empty = bs.summarize([], duration=0.0)
    assert empty["completed"] == 0 and empty["ttft_ms"] is None and empty["tpot_ms"] is None
    assert empty["cached_percent"] is None
    untold = bs.summarize([bs.Record(prompt_tokens=10, output_tokens=2, ttft=0.1)], 1.0)
    assert untold["cached_percent"] is None  # a server that does not say: "-", not 0


async def test_the_load_keeps_concurrency_and_arrival_times(
    autojump_clock: trio.testing.MockClock,
) -> None:
    specs = [rq.RequestSpec(f"p{i}", 4, 2) for i in range(12)]
    starts: list[float] = []
    in_flight = peak = 0

    async def send(spec: object) -> object:
        nonlocal in_flight, peak
        starts.append(trio.current_time())
        in_flight += 1
        peak = max(peak, in_flight)
        await trio.sleep(1.0)
        in_flight -= 1
        return bs.Record(prompt_tokens=4, output_tokens=2, ttft=0.5, latency=1.0)

    async def run(rate: float, limit: int | None) -> dict[str, object]:
        starts.clear()
        return await bs.run_load(specs, send, rate, limit, seed=0)

    out = await run(math.inf, 3)
    assert peak == 3 and out["completed"] == 12
    peak = 0
    t0 = trio.current_time()
    await run(2.0, None)
    offsets = rq.arrival_offsets(12, 2.0, random.Random(0))
    assert [s - t0 for s in starts] == pytest.approx(offsets, abs=1e-6)


def test_engine_options_become_rt_serve_flags() -> None:
    options = bs.parse_options(["load_format=null", "max_running_requests=512", "x=0.5", "y=true"])
    assert options == {"load_format": "null", "max_running_requests": 512, "x": 0.5, "y": True}
    servers = sys.modules["launch_servers"]  # bench_serving's sibling, imported with it
    assert servers.option_flags(options, {"x": "--x-flag"}) == [
        "--load-format", "null", "--max-running-requests", "512", "--x-flag", "0.5", "--y",
    ]  # fmt: skip
    assert servers.option_flags({"torch_compile": False}, {}) == []  # off by default
    names, _ = servers.rt_serve_flags()  # rt-serve's own table, where a flag is not the option's
    assert names.get("seed", "--seed") in bs.server_command("rt", 1, "/m", {"seed": 3})
    compiled = bs.server_command("rt", 1, "/m", {"torch_compile": True})
    assert compiled[-1] == "--enable-torch-compile"  # a switch, not --torch-compile
    for option, switch in (
        ("cuda_graph", "--disable-cuda-graph"),
        ("enable_prefix_cache", "--disable-radix-cache"),
        ("overlap_schedule", "--disable-overlap-schedule"),
    ):  # a False is the switch that turns it off, not left out
        assert bs.server_command("rt", 1, "/m", {option: False})[-1] == switch
    overlap = bs.server_command("rt", 1, "/m", {"overlap_schedule": True})
    assert overlap[-1] == "--enable-overlap-schedule"
    # True where only a switch that turns it off exists: the default, no flag
    # (there is no --cuda-graph, and rt-serve would exit 2 on one)
    assert bs.server_command("rt", 1, "/m", {"cuda_graph": True})[-2:] == ["--model-path", "/m"]
    assert servers.option_flags({"y": True}, {}, {("x", False): "--no-x"}) == ["--y"]
    command = bs.server_command("rt", 1234, "/m", {"load_format": "null"})
    assert command[1:3] == ["-m", "rt.serve"] and command[-2:] == ["--load-format", "null"]
    command = bs.server_command("transformers", 1234, "/m", {})
    assert command[1:3] == ["serve", "--continuous-batching"] and command[-1] == "/m"
    with pytest.raises(SystemExit):
        bs.parse_options(["no-equals-sign"])


def test_the_table_shows_every_run_and_dashes_for_missing_figures() -> None:
    run = {
        "server": "rt", "backend": "openai", "max_concurrency": 16, "client_cpu_percent": None,
        **bs.summarize([bs.Record(prompt_tokens=1, output_tokens=1, ttft=0.1, latency=0.1)], 1.0),
    }  # fmt: skip
    text = bs.table({"runs": [run]})
    header, row = text.splitlines()
    for figure in ("TTFT", "ITL", "TPOT", "E2E"):  # each with its mean, p50 and p99
        assert re.search(figure + r" mean +p50 +p99 ", header)
    assert "step→cl p50" in header
    cells = row.split()
    assert cells[8:11] == ["100.0"] * 3  # TTFT mean, p50, p99 of one 0.1 s request
    assert row.split()[:4] == ["rt", "openai", "16", "1"] and row.split()[-2:] == ["-", "-"]


@pytest.mark.slow
def test_the_command_runs_through_the_trio_api_with_the_null_model() -> None:
    out = subprocess.run(
        [
            sys.executable, str(TOOL), "--backend", "engine", "--rt-option", "load_format=null",
            "--num-prompts", "6", "--warmup", "1", "--input-len", "16", "--output-len", "4",
            "--max-concurrency", "1,3", "--json",
        ],
        capture_output=True, text=True, timeout=240, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout)
    assert [r["max_concurrency"] for r in result["runs"]] == [1, 3]
    for run in result["runs"]:
        assert (run["completed"], run["failed"], run["backend"]) == (6, 0, "engine")
        assert run["total_output_tokens"] == 6 * 4
        assert run["ttft_ms"]["p50"] > 0 and run["step_to_client_ms"] is not None


@pytest.mark.slow
def test_the_command_launches_rt_serve_and_drives_sse_and_the_websocket() -> None:
    out = subprocess.run(
        [
            sys.executable, str(TOOL), "--launch", "rt", "--backend", "openai,ws",
            "--num-prompts", "4", "--warmup", "1", "--input-len", "16", "--output-len", "4",
            "--max-concurrency", "2", "--json",
        ],
        capture_output=True, text=True, timeout=240, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout)
    assert [(r["server"], r["backend"]) for r in result["runs"]] == [
        ("rt", "openai"),
        ("rt", "ws"),
    ]
    for run in result["runs"]:
        assert (run["completed"], run["failed"]) == (4, 0), run["errors"]
        assert run["total_output_tokens"] == 4 * 4  # ignore_eos: exactly the lengths asked
        assert run["total_input_tokens"] >= 4 * 8
        assert 0 < run["ttft_ms"]["p50"] <= run["e2e_ms"]["p50"]
        # the ws run's prompts are its own, not the openai run's, which the prefix
        # cache holds (then ~90 % of its prompt tokens were cached): the BOS token
        # every prompt starts with, and a chance first token or two, at most
        assert run["cached_percent"] < 25


def test_the_client_is_pinned_while_it_sends_load_and_given_its_cpus_back_after() -> None:
    before = os.sched_getaffinity(0)
    last = max(before)
    with bs.client_pinned(str(last)):
        assert os.sched_getaffinity(0) == {last}
    assert os.sched_getaffinity(0) == before
    with bs.client_pinned(None):
        assert os.sched_getaffinity(0) == before
    # and a server launched for the comparison gets the scheduler's pinning as a flag
    command = bs.server_command("rt", 1, "/m", bs.parse_options([f"scheduler_cpus={last}"]))
    assert command[-2:] == ["--scheduler-cpus", str(last)]


def test_a_server_that_refuses_every_request_is_exit_1_and_the_json_is_strict() -> None:
    """It exited 0 with a table of dashes; its --json held Infinity (the default
    --request-rate), which strict parsers refuse."""

    def strict(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    argv = [sys.executable, str(TOOL), "--url", "http://127.0.0.1:1", "--num-prompts", "2",
            "--warmup", "0", "--json"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "a run completed no request" in out.stderr
    result = json.loads(out.stdout, parse_constant=strict)
    assert result["config"]["request_rate"] is None and result["runs"][0]["completed"] == 0
    bad = subprocess.run([*argv[:2], "--url", "http://127.0.0.1:1", "--request-rate", "0"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "--request-rate: expected a number > 0" in bad.stderr

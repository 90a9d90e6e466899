"""The rt-serve command: its flags, and SIGTERM/SIGINT (503 for new requests,
the requests in flight finish, exit 0, nothing left behind)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from serverlib import SLOW_STEPS, alive, children_of, running_server, start_server, write_plan
from trio_websocket import ConnectionClosed, open_websocket_url

from rt import errors
from rt.assets import default_model_path
from rt.config import EngineOptions
from rt.serve import ENGINE_FLAGS, SWITCHES, build_parser, main

SGLANG_FLAGS = [
    "--model-path",
    "--tokenizer-path",
    "--host",
    "--port",
    "--device",
    "--dtype",
    "--context-length",
    "--max-running-requests",
    "--max-total-tokens",
    "--page-size",
    "--chunked-prefill-size",
    "--schedule-policy",
    "--tokenizer-worker-num",
    "--api-key",
    "--served-model-name",
    "--log-level",
    "--watchdog-timeout",
    "--attention-backend",
    "--fault-plan",
    "--allow-auto-truncate",
]


def test_help_documents_every_flag_and_every_engine_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for flag in SGLANG_FLAGS:
        assert flag in text, flag
    covered = {f.option for f in ENGINE_FLAGS} | {option for option, _, _ in SWITCHES.values()}
    assert covered == set(EngineOptions.model_fields)  # a new engine option needs its flag
    for action in build_parser()._actions:
        assert action.help, action.option_strings


def test_backend_and_deterministic_flags_reach_the_engine_config() -> None:
    from rt.serve import engine_options

    args = build_parser().parse_args(["--enable-deterministic-inference"])
    config = EngineOptions.build(**engine_options(args)).engine_config()
    assert (config.deterministic, config.backend) == (True, "triton")
    args = build_parser().parse_args(["--device", "cuda", "--attention-backend", "flashinfer"])
    assert EngineOptions.build(**engine_options(args)).engine_config().backend == "flashinfer"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--attention-backend", "cudnn"])


def test_overlap_cuda_graph_and_compile_flags_reach_the_engine_config() -> None:
    from rt.serve import engine_options

    def config(*argv: str) -> Any:
        args = build_parser().parse_args(["--device", "cpu", *argv])  # (a later one wins)
        return EngineOptions.build(**engine_options(args)).engine_config()

    assert (config().use_overlap, config().overlap_schedule) == (False, None)  # the CPU
    assert config("--enable-overlap-schedule").use_overlap
    assert config("--device", "cuda", "--disable-overlap-schedule").use_overlap is False
    assert config("--disable-cuda-graph").cuda_graph is False
    assert config("--cuda-graph-max-bs", "48", "--max-running-requests", "32").graph_max_bs == 32
    assert config().torch_compile is False
    compiled = config("--enable-torch-compile", "--torch-compile-max-bs", "16")
    assert (compiled.torch_compile, compiled.torch_compile_max_bs) == (True, 16)
    with pytest.raises(SystemExit):  # the two overlap switches exclude each other
        build_parser().parse_args(["--enable-overlap-schedule", "--disable-overlap-schedule"])


def test_device_and_dtype_auto_pick_the_gpu_where_torch_sees_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user of SGLang or vLLM passes no --device on a GPU host: rt ran on its CPU."""
    import torch

    from rt.serve import engine_options

    def built(*argv: str) -> EngineOptions:
        return EngineOptions.build(**engine_options(build_parser().parse_args(list(argv))))

    here = "cuda" if torch.cuda.is_available() else "cpu"
    assert (built().device, built().dtype) == (here, "float32" if here == "cpu" else "bfloat16")
    assert (built("--dtype", "bfloat16").device, built("--device", "cpu").dtype) == (
        here,
        "float32",
    )
    # where torch sees a GPU: the default model's checkpoint is bfloat16, float32 gives float16
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    on_gpu = built()
    assert (on_gpu.device, on_gpu.dtype) == ("cuda", "bfloat16")
    assert on_gpu.engine_config().backend == "triton"  # the kernels, not the torch reference
    config = json.loads((Path(default_model_path()) / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "dtype": "float32"}))
    assert built("--model-path", str(tmp_path)).dtype == "float16"
    assert built("--device", "cpu").dtype == "float32"  # asked for: kept
    assert built("--dtype", "float32").dtype == "float32"
    # what the engine core refuses on the GPU is a flag error too, not a failed start
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SystemExit) as exit_:
        main(["--enable-torch-compile"])
    assert exit_.value.code == 2
    assert "torch_compile=True: it is for the CPU, not 'cuda'" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        errors.ConfigError, match="flashinfer' runs on CUDA only, and the device is the CPU"
    ):
        built("--attention-backend", "flashinfer")


@pytest.mark.parametrize(
    "argv",
    [
        ["--page-size", "0"],
        ["--dtype", "int3"],
        ["--max-body-size", "0"],
        ["--ws-max-in-flight", "0"],
        ["--max-connections", "-1"],
        ["--tcp-keepalive", "-1"],
        ["--tcp-keepalive", "40000"],
        ["--send-timeout", "0"],
        ["--send-timeout", "nan"],
        ["--allowed-origins", "*"],  # vLLM's form is a JSON list
        ["--allowed-origins", '["https://a.example", 5]'],
        ["--bogus"],
        ["--cuda-graph-max-bs", "0"],
        ["--scheduler-cpus", "3-1"],
        ["--scheduler-cpus", "4096"],  # no CPU this process may run on (it exited 1)
        ["--scheduler-cpus", ",".join(map(str, sorted(os.sched_getaffinity(0))))],  # all
        ["--port", "70000"],
        ["--host", "nosuch.invalid"],
        ["--api-key", ""],
        ["--context-length", "100000"],  # the model's max_position_embeddings is 512
        ["--fault-plan", "/nonexistent.json"],
        ["--model-path", "/nonexistent"],
        ["--device", "tpu"],
        ["--tokenizer-path", "/nonexistent"],
        ["--attention-backend", "flashinfer", "--device", "cpu"],  # CUDA only
        ["--chat-template", "/nonexistent.jinja"],
        ["--chat-template", "{% for m in messages %}{{ m['content'] }}"],  # no endfor
    ],
)
def test_a_bad_flag_exits_2_with_a_message(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert argv[0].lstrip("-").split("-")[0] in capsys.readouterr().err


def test_a_plan_in_rt_fault_plan_is_checked_as_one_in_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rule = {"actor": "scheduler", "point": "stepp", "action": "raise"}
    monkeypatch.setenv("RT_FAULT_PLAN", str(write_plan(tmp_path / "p.json", {"faults": [rule]})))
    with pytest.raises(SystemExit) as exit_:  # (it exited 1, once the engine had begun)
        main(["--load-format", "null"])
    assert exit_.value.code == 2
    assert "passes point 'stepp'" in capsys.readouterr().err
    monkeypatch.setenv("RT_FAULT_PLAN", "{not json")
    with pytest.raises(SystemExit) as exit_:
        main(["--load-format", "null"])
    assert exit_.value.code == 2
    assert "RT_FAULT_PLAN: fault plan is not valid json" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("rule", "said"),
    [
        ({"actor": "schedulr", "point": "step"}, "no actor matches 'schedulr'"),
        ({"actor": "scheduler", "point": "recieve"}, "passes point 'recieve'"),
        ({"actor": ["scheduler"], "point": "step"}, "actor must be a string"),
    ],
)
def test_a_fault_plan_for_no_actor_or_point_there_is_exits_2(
    rule: dict[str, Any], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before any process starts: a misspelled point exited 1 once the
    engine had begun ("could not start"), an unknown actor was taken and never
    fired (a chaos run silently fault-free), a wrong type was a traceback."""
    plan = write_plan(tmp_path / "p.json", {"seed": 1, "faults": [{**rule, "action": "raise"}]})
    with pytest.raises(SystemExit) as exit_:
        main(["--load-format", "null", "--fault-plan", str(plan)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err


@pytest.mark.parametrize("after_s", [0.5, 1.5])
def test_a_signal_in_the_first_moments_stops_it_cleanly(after_s: float) -> None:
    """While Python imported the server and its flags were checked (seconds:
    torch, the tokenizer), Ctrl-C was a KeyboardInterrupt traceback, or lost,
    the server then starting and serving."""
    script = Path(sys.executable).parent / "rt-serve"  # the console script users run
    proc = subprocess.Popen(
        [str(script), "--port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        time.sleep(after_s)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err and "SIGINT: stopping" in err, err[-2000:]
    assert "rt-serve ready" not in err


def test_a_configuration_the_scheduler_refuses_at_start_up_is_exit_2_at_once() -> None:
    """Found only by the scheduler's start-up (the KV pool is sized there): it was
    retried until the supervisor gave up, then exit 3; the server had said ready."""
    proc = subprocess.run(
        [sys.executable, "-m", "rt.serve", "--port", "0", "--mem-fraction-static", "1e-9"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "could not start" in proc.stderr and "mem_fraction=1e-09 leaves room" in proc.stderr
    assert "restarting" not in proc.stderr and "ready on" not in proc.stderr


def test_a_port_in_use_is_a_line_before_the_engine_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exit_:
            main(["--port", str(port)])
    assert exit_.value.code == 2
    assert f"--port {port}: cannot bind it (Address already in use)" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_refuses_new_requests_drains_and_exits_0(tmp_path: Path, sig: int) -> None:
    plan = write_plan(tmp_path / "slow.json", SLOW_STEPS)
    server = start_server("--load-format=null", f"--fault-plan={plan}", "--drain-timeout=60")
    try:
        body = {
            "text": "x",
            "stream": True,
            "sampling_params": {"max_new_tokens": 100, "ignore_eos": True},
        }
        # a batch of more prompts than start at once (INTAKE): those after the signal
        # are accepted work too (they were refused, and the whole batch with a 503)
        batch = {"text": ["x"] * 600, "sampling_params": {"max_new_tokens": 2}}
        got: dict[str, httpx.Response] = {}

        async def send_batch(client: httpx.AsyncClient) -> None:
            got["batch"] = await client.post("/generate", json=batch)

        async with (
            httpx.AsyncClient(base_url=server.url, timeout=60) as client,
            trio.open_nursery() as nursery,
        ):
            events = []
            async with client.stream("POST", "/generate", json=body) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    events.append(line[6:])
                    if len(events) == 1:
                        nursery.start_soon(send_batch, client)
                        with trio.fail_after(30):  # (in flight: some of it sent)
                            while server.info()["requests_in_flight"] < 2:
                                await trio.sleep(0.005)
                        server.proc.send_signal(sig)
                        with trio.fail_after(10):
                            while (await client.get("/health")).status_code != 503:
                                await trio.sleep(0.02)
                        refused = await client.post("/generate", json={"text": "y"})
                        assert refused.status_code == 503
                        assert "shutting down" in refused.json()["error"]["message"]
                        # a pause would hold the drain for its whole timeout
                        pause = await client.post("/pause_generation")
                        assert pause.status_code == 503, pause.text
                        assert "cannot be paused" in pause.json()["error"]["message"]
        assert events[-1] == "[DONE]"
        assert len(json.loads(events[-2])["output_ids"]) == 100
        assert got["batch"].status_code == 200, got["batch"].text[:300]
        assert len(got["batch"].json()) == 600
    finally:
        code = server.stop()
    assert code == 0
    assert any(f"stopped by {signal.Signals(sig).name}" in line for line in server.log), server.log[
        -5:
    ]


@pytest.mark.slow
async def test_a_drain_sends_every_websocket_frame_before_it_closes() -> None:
    """A /ws request held the drain only until its "done" frame was queued: a client
    reading a little slower than frames came lost the last deltas and "done" frames
    of accepted requests to the 1001 close (5 to 20 of 20 in each of 4 runs)."""
    server = start_server("--load-format=null")
    try:
        done: set[int] = set()
        long = {"max_new_tokens": 200, "ignore_eos": True}
        async with open_websocket_url(f"ws://127.0.0.1:{server.port}/ws") as ws:
            for i in range(20):
                frame = {"id": i, "type": "generate", "text": "x", "sampling_params": long}
                await ws.send_message(json.dumps(frame))
            await trio.sleep(0.2)
            server.proc.send_signal(signal.SIGINT)
            with pytest.raises(ConnectionClosed) as closed, trio.fail_after(60):
                while True:
                    frame = json.loads(await ws.get_message())
                    await trio.sleep(0.001)  # a client slightly slower than the server
                    if frame["type"] == "done":
                        assert frame["meta_info"]["completion_tokens"] == 200, frame
                        done.add(frame["id"])
                    else:
                        assert frame["type"] == "delta", frame
            await ws._stream.aclose()  # (trio-websocket leaves it open: see the test below)
        assert closed.value.reason.code == 1001
        assert done == set(range(20))
    finally:
        code = server.stop()
    assert code == 0


@pytest.mark.slow
def test_a_slow_start_says_it_is_still_starting(tmp_path: Path) -> None:
    """While the model loads (here a scheduler slow to start), a line every few
    seconds says rt-serve is still at it, before the one that says it is ready."""
    slow = {
        "seed": 1,
        "faults": [{"actor": "scheduler", "point": "startup", "action": "delay", "delay_ms": 6000}],
    }
    server = start_server(
        "--load-format=null", f"--fault-plan={write_plan(tmp_path / 'p.json', slow)}"
    )
    try:
        still = [i for i, line in enumerate(server.log) if "still starting" in line]
        ready = next(i for i, line in enumerate(server.log) if "rt-serve ready on" in line)
        assert still and still[0] < ready, server.log
    finally:
        assert server.stop() == 0


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "times"), [(signal.SIGINT, 1), (signal.SIGTERM, 5)])
def test_a_signal_during_start_up_stops_cleanly(sig: int, times: int) -> None:
    """Repeated (a supervisor repeating itself while the start-up stops), a later
    one must not kill rt-serve before its children and segments are gone."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rt.serve", "--port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        log = []
        for line in proc.stderr:
            log.append(line)
            if "ready" in line and "actor" in line:  # the first actor is up, the others start
                break
        children = children_of(proc.pid)
        assert children
        for _ in range(times):
            proc.send_signal(sig)
            time.sleep(0.1)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == 0, "".join(log) + err
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in children if alive(pid)]
    assert not [s for s in os.listdir("/dev/shm") if s.startswith(f"rt_{proc.pid}_")]


def threads_cpus(pid: int) -> set[int]:
    """The CPUs every thread of a process may run on (one set if they agree)."""
    masks = {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}
    assert len(masks) == 1, f"pid {pid}'s threads are pinned apart: {masks}"
    return set(next(iter(masks)))


def test_the_ready_line_comes_at_any_log_level() -> None:
    """It was an INFO line: under --log-level warning nothing told a caller of
    --port 0 the port, and it waited for good."""
    with running_server("--load-format=null", "--log-level=warning") as server:
        assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
        assert not any(" INFO " in line for line in server.log)  # the level holds


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin apart")
def test_scheduler_cpus_pin_the_scheduler_apart_from_the_front_and_the_other_actors() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    mine, rest = {allowed[-1]}, set(allowed[:-1])
    body = {"text": "pinned", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    with running_server(f"--scheduler-cpus={allowed[-1]}") as server:
        assert any("pinned: the scheduler to CPUs" in line for line in server.log)
        first = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
        actors = {a["name"]: a for a in server.info()["actors"]}
        assert threads_cpus(actors["scheduler"]["pid"]) == mine
        assert actors["scheduler"]["cpus"] == str(allowed[-1])
        for name in ("detokenizer", "tokenizer0"):
            assert threads_cpus(actors[name]["pid"]) == rest, name
        assert threads_cpus(server.proc.pid) == rest  # the front, hypercorn's threads too
        # a restarted scheduler is pinned as its predecessor was, and serves the same
        os.kill(actors["scheduler"]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            again = {a["name"]: a for a in server.info()["actors"]}["scheduler"]
            if again["restart_count"] == 1 and again["state"] == "running":
                break
            time.sleep(0.1)
        assert again["restart_count"] == 1 and again["state"] == "running"
        assert threads_cpus(again["pid"]) == mine
        second = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
        assert second["output_ids"] == first["output_ids"]


async def read_sse(
    client: httpx.AsyncClient, body: dict[str, Any], events: list[Any], first: trio.Event
) -> None:
    """The events of one streamed /generate into ``events``, to its end; ``first``
    is set at the first."""
    async with client.stream("POST", "/generate", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                first.set()


def stalled_upload(server_url: str) -> socket.socket:
    """A connection whose request body never comes."""
    host, port = server_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    return sock


LONG = {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}}
# 200 ms a step: LONG takes 100 s, past every wait below
SLOWER_STEPS = {
    "seed": 1,
    "faults": [
        {"actor": "scheduler", "point": "step", "action": "delay", "delay_ms": 200, "times": 0}
    ],
}


@pytest.mark.slow
async def test_what_a_drain_leaves_fails_with_an_error_its_client_reads(tmp_path: Path) -> None:
    """The drain runs out (1 s) on an SSE stream and a WebSocket request that need
    100 s more, beside an upload whose body never comes (not the engine's: it does
    not hold the drain): all three get an error that says so (the upload a 503),
    and the server exits 0 long before the upload's --body-timeout."""
    plan = write_plan(tmp_path / "slower.json", SLOWER_STEPS)
    server = start_server(
        "--load-format=null", f"--fault-plan={plan}", "--drain-timeout=1", "--body-timeout=300"
    )
    upload = stalled_upload(server.url)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            ws_url = server.url.replace("http://", "ws://") + "/ws"
            async with open_websocket_url(ws_url) as ws, trio.open_nursery() as nursery:
                body = {k: v for k, v in LONG.items() if k != "stream"}  # /ws streams always
                await ws.send_message(json.dumps({"id": "w", "type": "generate", **body}))
                reply = json.loads(await ws.get_message())
                assert reply["type"] == "delta", reply
                first = trio.Event()
                events: list[Any] = []
                nursery.start_soon(read_sse, client, LONG, events, first)
                await first.wait()
                server.proc.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                with trio.fail_after(60):
                    while (frame := json.loads(await ws.get_message()))["type"] == "delta":
                        pass
                    with pytest.raises(ConnectionClosed) as closed:
                        await ws.get_message()
                    # trio-websocket 0.12 never closes a client's socket that the server
                    # closed the WebSocket on (its reader stops at EOF; aclose() returns
                    # early): a ResourceWarning, unless closed here
                    await ws._stream.aclose()
                assert closed.value.reason.code == 1001  # going away (it was a bare 1006)
        code = server.stop()
        answer = b""
        while chunk := upload.recv(65536):  # to EOF
            answer += chunk
    finally:
        upload.close()
        if server.proc.poll() is None:
            server.stop()
    assert code == 0
    assert time.monotonic() - signalled < 60  # the upload would hold it 300 s
    assert answer.startswith(b"HTTP/1.1 503 "), answer  # not a dropped connection
    assert frame["type"] == "error" and frame["status"] == 503, frame
    assert "stopped (SIGTERM) before the request finished" in frame["message"]
    assert events[-1] == "[DONE]"
    assert "stopped (SIGTERM)" in events[-2]["error"]["message"], events[-2]


@pytest.mark.slow
async def test_a_second_signal_ends_the_drain_at_once(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "slower.json", SLOWER_STEPS)
    server = start_server("--load-format=null", f"--fault-plan={plan}", "--drain-timeout=300")
    try:
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=60) as client,
            trio.open_nursery() as nursery,
        ):
            first = trio.Event()
            events: list[Any] = []
            nursery.start_soon(read_sse, client, LONG, events, first)
            await first.wait()
            server.proc.send_signal(signal.SIGTERM)
            with trio.fail_after(10):
                while (await client.get("/health")).status_code != 503:
                    await trio.sleep(0.02)
            server.proc.send_signal(signal.SIGINT)
            signalled = time.monotonic()
        code = server.stop()
    finally:
        if server.proc.poll() is None:
            server.stop()
    assert code == 0
    assert time.monotonic() - signalled < 60  # not the 300 s drain
    assert events[-1] == "[DONE]"
    assert "stopped (SIGTERM)" in events[-2]["error"]["message"], events[-2]
    assert any("SIGINT again: stopping now" in line for line in server.log), server.log[-5:]


def test_clients_that_never_read_do_not_hold_the_stop() -> None:
    """hypercorn writes to a client shielded, with no timeout: streams whose
    clients stop reading (a full TCP window) but keep their connections open
    once held the server past its stop until they left. The stop is a SIGHUP
    (the terminal closing), which once killed rt-serve outright: exit -1, its
    segments left behind."""
    server = start_server("--drain-timeout=1")
    clients: list[socket.socket] = []
    try:
        for _ in range(2):  # SSE; logprobs make every event big
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
            sock.connect(("127.0.0.1", server.port))
            body = json.dumps(
                {
                    "text": ["In the beginning"] * 8,
                    "stream": True,
                    "return_logprob": True,
                    "top_logprobs_num": 20,
                    "sampling_params": {"max_new_tokens": 400, "ignore_eos": True},
                }
            ).encode()
            head = f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
            sock.sendall(head.encode() + body)
            clients.append(sock)
        time.sleep(4)  # the server's writes to them fill their windows and wait
        assert server.info()["requests_in_flight"] > 0
        stopping = time.monotonic()
        code = server.stop(signal.SIGHUP)  # (it checks that no process or segment is left)
        took = time.monotonic() - stopping
    finally:
        if server.proc.poll() is None:
            server.stop()
        for sock in clients:
            sock.close()
    assert code == 0
    assert took < 30, f"the stop took {took:.1f} s"  # drain 1 s, farewell 2 s, cut 2 s
    assert any("still open" in line and "cut" in line for line in server.log), server.log[-5:]
    assert any("stopped by SIGHUP" in line for line in server.log), server.log[-5:]


def test_cuda_asked_for_on_a_host_without_it_is_a_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It was found by the scheduler's start-up, retried until the supervisor
    gave up (~15 s, exit 3)."""
    import torch

    if torch.cuda.is_available():
        argv = ["--device", f"cuda:{torch.cuda.device_count()}"]  # one past the last
    else:
        argv = ["--device", "cuda"]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "CUDA device(s) here" in capsys.readouterr().err


def test_another_models_tokenizer_is_a_line(
    tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was taken: every text then failed as a client error naming input_ids."""
    from rt.assets import default_model_path

    with pytest.raises(SystemExit) as exit_:
        main(["--model-path", str(tiny_model), "--tokenizer-path", str(default_model_path())])
    assert exit_.value.code == 2
    assert "it is not this model's tokenizer" in capsys.readouterr().err


async def test_an_engine_that_gives_up_tells_the_streams_it_cuts(tmp_path: Path) -> None:
    """An escalation (exit 3) cancelled the server under its clients: SSE streams
    ended on a truncated body, with no error event and no [DONE]."""
    plan = write_plan(tmp_path / "slower.json", SLOWER_STEPS)
    server = start_server("--load-format=null", f"--fault-plan={plan}", "--max-restarts=0")
    try:
        events: list[Any] = []
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=60) as client,
            trio.open_nursery() as nursery,
        ):
            first = trio.Event()

            async def read() -> None:
                try:
                    await read_sse(client, LONG, events, first)
                except httpx.RemoteProtocolError:  # a cut, with no last word
                    events.append("(cut)")

            nursery.start_soon(read)
            await first.wait()
            os.kill(server.actor_pids()["detokenizer"], signal.SIGKILL)  # no restart allowed
        code = server.stop()
    finally:
        if server.proc.poll() is None:
            server.stop()
    assert code == 3, server.log[-5:]
    assert events[-1] == "[DONE]", (events[-2:], server.log[-30:])
    assert "gave up" in events[-2]["error"]["message"], events[-2]


@pytest.mark.slow
def test_rt_serve_chat_template_reaches_chat_completions(tmp_path: Path) -> None:
    path = tmp_path / "chat.jinja"
    looping = "{% for i in range(reps or 0) %}{% for j in range(reps) %}{% endfor %}{% endfor %}"
    path.write_text(looping + "{% for m in messages %}[{{ m.role }}] {{ m.content }} {% endfor %}")
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 1}
    flags = ("--load-format=null", f"--chat-template={path}", "--watchdog-timeout=4")
    with running_server(*flags) as server:
        out = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert out.status_code == 200, out.text
        mine = out.json()["usage"]["prompt_tokens"]
        # a variable that makes it loop: a 400 at the render's limit, nobody restarted
        kwargs = {"chat_template_kwargs": {"reps": 100000}}
        out = httpx.post(f"{server.url}/v1/chat/completions", json=body | kwargs, timeout=60)
        assert out.status_code == 400, out.text
        assert "ran past its time limit (1 s)" in out.json()["error"]["message"]
        info = httpx.get(f"{server.url}/server_info", timeout=60).json()
        assert info["config"]["chat_template"] == str(path)
        assert [a["restart_count"] for a in info["actors"]] == [0] * len(info["actors"])
    with running_server("--load-format=null") as server:
        out = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert out.json()["usage"]["prompt_tokens"] != mine

"""rt's shared-memory rings against SGLang's transport, between two processes.

Transports:
  rt            rt rings carrying rt's messages with rt's codec: the small request is
                a message Struct (MessagePack), the large batch a dict of arrays
                (pickle 5, the arrays out of band)
  zmq           pyzmq PUSH/PULL over ipc://, pickled dicts of lists (what SGLang sends)
  zmq_rt_codec  the same ZMQ sockets carrying what rt carries, with rt's codec
                (so rt vs zmq_rt_codec is the transport's gain, zmq_rt_codec vs zmq the codec's)
  mp_queue      multiprocessing.Queue, pickled dicts of lists
  rt_batched    rt rings with 32 messages per frame (one-way throughput only), as rt's
                actors send: one frame per scheduler step, one per tokenizer batch

Payloads: small = a tokenized request (32-char id + 20 token ids, ~200 B pickled);
large = one step's output for 64 requests (id + ~27 token ids each, ~8 KB pickled).

Figures: one-way throughput (the child sends, this process receives and decodes)
and ping-pong round trips back to back (continuous traffic), medians over rounds;
each round runs every transport once, so their rounds interleave.

With ``--contend N`` the whole comparison runs twice: on the machine as it is
(quiet), then beside N busy processes (``while True: pass``, started and
killed by this tool, and each bounded in time), as on an oversubscribed host.

With ``--placement same`` both endpoints of every transport (and ZMQ's I/O
threads) run on CPU 0; with ``split`` this process on CPU 0 and its peer on
CPU 1; ``free`` (the default) leaves them to the kernel. Beside busy processes a
round trip's tail depends on it (docs/benchmarks.md): on one CPU the waker
parks and the woken peer runs at once, on two it must preempt a busy process
there, and ~1.5% of the round trips wait out a time slice. Where the kernel
puts them differs from run to run, so a comparison is fair only within one
placement.

    python tools/bench_ipc.py [--rounds 3] [--quick] [--contend N] [--transports rt,zmq]
        [--placement free|same|split] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import pickle
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import trio
import zmq

from rt.chaos.cli import at_least
from rt.errors import WouldBlock
from rt.messages import Message
from rt.shm import Ring, RingReceiver, RingSender, RingSpec, codec, new_run_prefix

TRANSPORTS = ("rt", "zmq", "zmq_rt_codec", "mp_queue")
BATCH = 32  # rt_batched: messages per frame, the way rt's actors send (a step, a batch)
PLACEMENTS = {"free": None, "same": (0, 0), "split": (0, 1)}  # (this process's CPU, the peer's)
PEER_CPU = "RT_BENCH_PEER_CPU"  # the environment variable that tells a peer where to run


def place_peer() -> None:
    """In a peer process: run on the CPU the placement gives it, if any."""
    cpu = os.environ.get(PEER_CPU)
    if cpu is not None:
        os.sched_setaffinity(0, {int(cpu)})


class SmallRequest(Message, frozen=True):
    """The small payload as an rt message: the same five fields as the dict."""

    rid: str
    input_ids: list[int]
    max_new_tokens: int
    temperature: float
    stream: bool


codec.register(SmallRequest)


def small_message(as_message: bool) -> Any:
    if as_message:
        return SmallRequest(uuid.uuid4().hex, list(range(1000, 1020)), 128, 0.7, True)
    return {
        "rid": uuid.uuid4().hex,
        "input_ids": list(range(1000, 1020)),
        "max_new_tokens": 128,
        "temperature": 0.7,
        "stream": True,
    }


def large_message(as_arrays: bool) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 35, size=64)
    ids = [rng.integers(0, 32000, size=int(n)).tolist() for n in lengths]
    rids = [uuid.uuid4().hex for _ in range(64)]
    if not as_arrays:
        return {"rids": rids, "output_ids": ids, "finished": [False] * 64}
    return {
        "rids": rids,
        "output_ids": np.concatenate([np.asarray(x, dtype=np.int32) for x in ids]),
        "offsets": np.cumsum(lengths).astype(np.int32),
        "finished": np.zeros(64, dtype=bool),
    }


def message(payload: str, transport: str) -> Any:
    rt_form = transport in ("rt", "zmq_rt_codec")
    return small_message(rt_form) if payload == "small" else large_message(rt_form)


def flat(encoded: bytes | list[bytes | memoryview]) -> bytes:
    """rt's codec output as one message, for ZMQ."""
    return encoded if isinstance(encoded, bytes) else b"".join(encoded)


# --- the child side: python bench_ipc.py --child TRANSPORT MODE PAYLOAD N ADDR ---------


def child(transport: str, mode: str, payload: str, n: int, addr: str) -> None:
    place_peer()
    if transport == "rt":
        trio.run(rt_child, mode, payload, n, addr)
        return
    use_rt_codec = transport == "zmq_rt_codec"
    ctx = zmq.Context()
    out, inp = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    out.connect(f"ipc://{addr}.up")
    inp.connect(f"ipc://{addr}.down")

    recv, send = zmq_endpoints(out, inp, use_rt_codec)
    recv()  # go
    if mode == "throughput":
        msg = message(payload, transport)
        for _ in range(n):
            send(msg)
    else:
        for _ in range(n + 1):  # one untimed round trip first (see measure)
            send(recv())
    recv()  # done
    ctx.destroy(linger=0)


def zmq_endpoints(
    out: zmq.Socket[bytes], inp: zmq.Socket[bytes], use_rt_codec: bool
) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """Receive and send objects over ZMQ, methods bound once (as rt_endpoints does)."""
    send_bytes, recv_bytes = out.send, inp.recv
    loads: Callable[[bytes], Any] = codec.loads if use_rt_codec else pickle.loads
    if use_rt_codec:
        rt_dumps = codec.dumps

        def send(obj: Any) -> None:
            send_bytes(flat(rt_dumps(obj)))

    else:
        dumps = pickle.dumps

        def send(obj: Any) -> None:
            send_bytes(dumps(obj))

    def recv() -> Any:
        return loads(recv_bytes())

    return recv, send


def rt_endpoints(
    tx: RingSender, rx: RingReceiver
) -> tuple[Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]]:
    """Receive and send objects over rt rings: the nowait call first, trio's
    waiting only when the ring is empty or full. Payloads are received alone
    (``receive_data``) and committed once handled (when the next one is
    asked for), in batches: every 64 frames, and whenever the ring runs dry."""
    uncommitted = 0
    receive_nowait, send_nowait, loads, dumps = (
        rx.receive_data_nowait,
        tx.send_nowait,
        codec.loads,
        codec.dumps,
    )

    async def recv() -> Any:
        nonlocal uncommitted
        if uncommitted >= 64:
            rx.commit()
            uncommitted = 0
        try:
            data = receive_nowait()
        except WouldBlock:
            rx.commit()
            data = await rx.receive_data()
        uncommitted += 1
        return loads(data)

    async def send(obj: Any) -> None:
        data = dumps(obj)
        try:
            send_nowait(data)
        except WouldBlock:
            await tx.send(data)

    return recv, send


async def rt_child(mode: str, payload: str, n: int, addr: str) -> None:
    up_spec, down_spec = (RingSpec(**d) for d in json.loads(addr))
    tx, rx = RingSender.attach(up_spec), RingReceiver.attach(down_spec)
    recv, send = rt_endpoints(tx, rx)
    await recv()  # go
    if mode == "throughput":
        msg = message(payload, "rt")
        for _ in range(n):
            await send(msg)
    elif mode == "batched":
        batch = [message(payload, "rt") for _ in range(BATCH)]  # distinct: no pickle memo
        for _ in range(n // BATCH):
            await send(batch)
    else:
        for _ in range(n + 1):
            await send(await recv())
    await recv()  # done
    tx.close()
    rx.close()


# --- the parent side ----------------------------------------------------------------


@dataclasses.dataclass
class Result:
    msgs_per_s: float
    rtt_p50_us: float | None  # None: not measured (rt_batched)
    rtt_p99_us: float | None


async def measure(
    recv: Callable[[], Awaitable[Any]],
    send: Callable[[Any], Awaitable[None]],
    mode: str,
    payload: str,
    transport: str,
    n: int,
) -> list[float]:
    """Throughput: [msgs/s]. Ping-pong: every round trip in seconds."""
    await send("go")
    if mode == "batched":  # frames of BATCH messages: count messages
        await recv()
        start = time.perf_counter()
        for _ in range(n // BATCH - 1):
            await recv()
        elapsed = time.perf_counter() - start
        await send("done")
        return [(n // BATCH - 1) * BATCH / elapsed]
    if mode == "throughput":
        await recv()
        start = time.perf_counter()
        for _ in range(n - 1):
            await recv()
        elapsed = time.perf_counter() - start
        await send("done")
        return [(n - 1) / elapsed]
    msg = message(payload, transport)
    # One untimed round trip first: an rt send does not wait for the child to
    # attach (a ZMQ PUSH does), so the first one would time the child's start-up.
    await send(msg)
    await recv()
    rtts = []
    for _ in range(n):
        start = time.perf_counter()
        await send(msg)
        await recv()
        rtts.append(time.perf_counter() - start)
    await send("done")
    return rtts


def blocking(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """A blocking call as a coroutine (a benchmark may block its own event loop)."""

    async def call(*args: Any) -> Any:
        return fn(*args)

    return call


def spawn(
    transport: str, mode: str, payload: str, n: int, addr: str, fds: tuple[int, ...] = ()
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, __file__, "--child", transport, mode, payload, str(n), addr]
    return subprocess.Popen(cmd, pass_fds=fds, stdin=subprocess.DEVNULL)


def run_zmq(transport: str, mode: str, payload: str, n: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="rt-bench-") as tmp:  # its sockets go with it
        return _run_zmq(transport, mode, payload, n, os.path.join(tmp, "sock"))


def _run_zmq(transport: str, mode: str, payload: str, n: int, addr: str) -> list[float]:
    use_rt_codec = transport == "zmq_rt_codec"
    ctx = zmq.Context()
    inp, out = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    inp.bind(f"ipc://{addr}.up")
    out.bind(f"ipc://{addr}.down")
    proc = spawn(transport, mode, payload, n, addr)

    recv, send = zmq_endpoints(out, inp, use_rt_codec)
    try:
        return trio.run(measure, blocking(recv), blocking(send), mode, payload, transport, n)
    finally:
        proc.wait()
        ctx.destroy(linger=0)


def mp_child(mode: str, payload: str, n: int, up: Any, down: Any) -> None:
    place_peer()
    down.get()
    if mode == "throughput":
        msg = message(payload, "mp_queue")
        for _ in range(n):
            up.put(msg)
    else:
        for _ in range(n + 1):
            up.put(down.get())
    down.get()


def run_mp_queue(mode: str, payload: str, n: int) -> list[float]:
    ctx = mp.get_context("spawn")
    up, down = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=mp_child, args=(mode, payload, n, up, down))
    proc.start()
    try:
        return trio.run(measure, blocking(up.get), blocking(down.put), mode, payload, "mp_queue", n)
    finally:
        proc.join()


def run_rt(mode: str, payload: str, n: int) -> list[float]:
    prefix = new_run_prefix()
    with Ring.create(prefix, "up", 1 << 20) as up, Ring.create(prefix, "down", 1 << 20) as down:
        addr = json.dumps([dataclasses.asdict(up.spec), dataclasses.asdict(down.spec)])
        proc = spawn("rt", mode, payload, n, addr, up.fds + down.fds)
        try:
            return trio.run(rt_parent, up.spec, down.spec, mode, payload, n)
        finally:
            proc.wait()


async def rt_parent(up: RingSpec, down: RingSpec, mode: str, payload: str, n: int) -> list[float]:
    rx, tx = RingReceiver.attach(up), RingSender.attach(down)
    recv, send = rt_endpoints(tx, rx)
    try:
        return await measure(recv, send, mode, payload, "rt", n)
    finally:
        rx.close()
        tx.close()


def run(transport: str, mode: str, payload: str, n: int) -> list[float]:
    if transport == "rt":
        return run_rt(mode, payload, n)
    if transport == "mp_queue":
        return run_mp_queue(mode, payload, n)
    return run_zmq(transport, mode, payload, n)


def bench(
    rounds: int, quick: bool, transports: tuple[str, ...] = TRANSPORTS
) -> dict[str, dict[str, Result]]:
    counts = (
        {"small": (20_000, 2_000), "large": (4_000, 1_000)}
        if quick
        else {"small": (200_000, 10_000), "large": (30_000, 5_000)}
    )
    out: dict[str, dict[str, Result]] = {}
    for payload, (n_tp, n_rtt) in counts.items():
        tps: dict[str, list[float]] = {t: [] for t in transports}
        p50s: dict[str, list[float]] = {t: [] for t in transports}
        p99s: dict[str, list[float]] = {t: [] for t in transports}
        batched = []
        # Rounds interleave the transports, so that each one's rounds spread over the
        # same stretch of time: beside busy processes, where the kernel puts whom
        # drifts over minutes, and back-to-back blocks would compare two moments.
        for _ in range(rounds):
            for transport in transports:
                tps[transport] += run(transport, "throughput", payload, n_tp)
                rtts = np.array(run(transport, "pingpong", payload, n_rtt)) * 1e6
                p50s[transport].append(float(np.percentile(rtts, 50)))
                p99s[transport].append(float(np.percentile(rtts, 99)))
            if "rt" in transports:
                batched += run_rt("batched", payload, n_tp)
        out[payload] = {
            t: Result(
                statistics.median(tps[t]), statistics.median(p50s[t]), statistics.median(p99s[t])
            )
            for t in transports
        }
        if "rt" in transports:
            out[payload]["rt_batched"] = Result(statistics.median(batched), None, None)
    return out


BUSY_LOOP = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end: pass"


@contextmanager
def busy_processes(n: int, limit_s: float) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` processes that each keep a core busy (a bare Python loop), killed on
    the way out and, should this tool be killed first, gone after ``limit_s``."""
    every_cpu = range(os.cpu_count() or 1)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUSY_LOOP.format(limit=limit_s)],
            stdin=subprocess.DEVNULL,
            # free to run anywhere, whatever this process's placement
            preexec_fn=lambda: os.sched_setaffinity(0, every_cpu),
        )
        for _ in range(n)
    ]
    try:
        time.sleep(0.2)  # let them reach their loop
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def table(results: dict[str, dict[str, Result]]) -> str:
    lines = [
        f"{'payload':8} {'transport':13} {'msgs/s':>10} {'vs zmq':>7} "
        f"{'rtt p50 µs':>11} {'rtt p99 µs':>11} {'p50 vs zmq':>11} {'p99 vs zmq':>11}"
    ]
    for payload, by_transport in results.items():
        zmq_r = by_transport["zmq"]
        for name, r in by_transport.items():
            rtt = (
                f"{r.rtt_p50_us:11.1f} {r.rtt_p99_us:11.1f} "
                f"{r.rtt_p50_us / (zmq_r.rtt_p50_us or 1):10.2f}x "
                f"{r.rtt_p99_us / (zmq_r.rtt_p99_us or 1):10.2f}x"
                if r.rtt_p50_us is not None and r.rtt_p99_us is not None
                else f"{'-':>11} {'-':>11} {'-':>11} {'-':>11}"
            )
            lines.append(
                f"{payload:8} {name:13} {r.msgs_per_s:10.0f} "
                f"{r.msgs_per_s / zmq_r.msgs_per_s:6.2f}x {rtt}"
            )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        transport, mode, payload, n, addr = sys.argv[2:7]
        child(transport, mode, payload, int(n), addr)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    parser.add_argument(
        "--contend",
        type=int,
        default=0,
        metavar="N",
        help="also run beside N busy processes, and report both tables",
    )
    parser.add_argument(
        "--contend-limit",
        type=float,
        default=1800.0,
        metavar="S",
        help="seconds after which a busy process stops by itself (default 1800)",
    )
    parser.add_argument(
        "--transports",
        default=",".join(TRANSPORTS),
        help=f"which to compare, comma-separated, zmq among them (default {','.join(TRANSPORTS)})",
    )
    parser.add_argument(
        "--placement",
        choices=tuple(PLACEMENTS),
        default="free",
        help="same: both endpoints on CPU 0; split: this process on CPU 0, its peer on "
        "CPU 1; free: where the kernel puts them (default)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    cpus = PLACEMENTS[args.placement]
    if cpus is not None:
        if not set(cpus) <= os.sched_getaffinity(0):
            parser.error(f"--placement {args.placement} needs CPUs {sorted(set(cpus))}")
        os.sched_setaffinity(0, {cpus[0]})
        os.environ[PEER_CPU] = str(cpus[1])
    transports = tuple(args.transports.split(","))
    if "zmq" not in transports or not set(transports) <= set(TRANSPORTS):
        parser.error(f"--transports: a subset of {','.join(TRANSPORTS)} with zmq in it")
    # SIGTERM unwinds like Ctrl-C, so the busy processes are killed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = bench(args.rounds, args.quick, transports)
    if not args.contend:
        print(as_json(results) if args.json else table(results))
        return
    with busy_processes(args.contend, args.contend_limit):
        contended = bench(args.rounds, args.quick, transports)
    if args.json:
        print(
            f'{{"busy_processes": {args.contend}, "placement": "{args.placement}", '
            f'"quiet": {as_json(results)}, '
            f'"contended": {as_json(contended)}}}'
        )
    else:
        print(f"placement {args.placement}\n")
        print(f"quiet\n{table(results)}\n\nbeside {args.contend} busy processes\n")
        print(table(contended))


def as_json(results: dict[str, dict[str, Result]]) -> str:
    return json.dumps(
        {p: {t: dataclasses.asdict(r) for t, r in by.items()} for p, by in results.items()}
    )


if __name__ == "__main__":
    main()

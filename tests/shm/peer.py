"""The other end of a ring, run as a separate interpreter by the tests.

python peer.py produce SPEC_JSON N SEED      send N seeded frames (see frames())
python peer.py consume SPEC_JSON N LOG       receive N frames of 8 bytes or more: append
                                             each frame's sequence number to LOG, commit
python peer.py trickle SPEC_JSON N           send N small frames 0.2 ms apart, then wait
                                             forever, attached
python peer.py attach-sender SPEC_JSON       attach as producer and wait forever
python peer.py attach-receiver SPEC_JSON     attach as consumer and wait forever
python peer.py own-ring                      create a ring of its own run, print its
                                             name, wait forever (for the sweep test)
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
from collections.abc import Iterator

import trio

from rt.errors import WouldBlock
from rt.shm import Ring, RingReceiver, RingSender, RingSpec, new_run_prefix

POOL = random.Random(0).randbytes(1 << 20)


def frames(
    n: int, seed: int, capacity: int, min_size: int = 1
) -> Iterator[tuple[int, bytes, memoryview]]:
    """Frame i: min_size to 4 * capacity bytes (log-uniform); its first bytes are
    the 8-byte sequence number (cut short for tiny frames), the rest a slice of POOL."""
    rng = random.Random(seed)
    top = math.log(4 * capacity)
    pool = memoryview(POOL)
    for seq in range(n):
        size = max(min_size, int(math.exp(rng.uniform(0, top))))
        tag = seq.to_bytes(8, "little")[:size]
        rest = size - len(tag)
        off = rng.randrange(len(POOL) - rest)
        yield seq, tag, pool[off : off + rest]


async def produce(spec: RingSpec, n: int, seed: int) -> None:
    tx = RingSender.attach(spec)
    for _, tag, rest in frames(n, seed, spec.capacity):
        try:
            tx.send_nowait([tag, rest])
        except WouldBlock:
            await tx.send([tag, rest])
    await tx.aclose()


async def consume(spec: RingSpec, n: int, log_path: str) -> None:
    rx = RingReceiver.attach(spec)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    for _ in range(n):
        frame = await rx.receive()
        # Handling = a durable record (the page cache survives SIGKILL), then commit.
        os.write(fd, frame.data[:8])
        rx.commit(frame)
    os.close(fd)
    await rx.aclose()


async def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "own-ring":
        ring = Ring.create(new_run_prefix(), "orphan", capacity=4096)
        print(ring.spec.name, flush=True)
        await trio.sleep_forever()
    spec = RingSpec(**json.loads(argv[1]))
    if mode == "produce":
        await produce(spec, int(argv[2]), int(argv[3]))
    elif mode == "consume":
        await consume(spec, int(argv[2]), argv[3])
    elif mode == "trickle":
        tx = RingSender.attach(spec)
        for i in range(int(argv[2])):
            await trio.sleep(0.0002)
            await tx.send(i.to_bytes(8, "little"))
        await trio.sleep_forever()
    elif mode == "attach-sender":
        RingSender.attach(spec)
        print("attached", flush=True)
        await trio.sleep_forever()
    elif mode == "attach-receiver":
        RingReceiver.attach(spec)
        print("attached", flush=True)
        await trio.sleep_forever()
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])

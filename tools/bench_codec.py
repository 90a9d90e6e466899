"""rt's codec on rt's own messages: MessagePack (how they cross now) against
pickle 5 with arrays out of band (the codec's other path), same objects, one run.

    python tools/bench_codec.py [--json]

Messages: a Tokenized request (32-char id, 20 ids); a Scheduled request
(20 ids, sampling parameters); a scheduler step for 64 sequences (one new
token each); the detokenizer's deltas for the same 64 sequences.
Figures: µs per encode and per decode (best of 7 repeats).
"""

from __future__ import annotations

import argparse
import json
import timeit
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from rt import messages as m
from rt.chaos.cli import at_least
from rt.gpu.sampling_params import SamplingParams
from rt.shm import codec


def examples() -> dict[str, m.Message]:
    ids = np.arange(1000, 1020, dtype=np.int32)
    rids = [uuid.uuid4().hex for _ in range(64)]
    seqs = tuple(m.SeqTokens(rid, 0, 17, (42,), prompt_tokens=20) for rid in rids)
    deltas = tuple(m.SeqDelta(rid, 0, 17, (42,), 80, " word", prompt_tokens=20) for rid in rids)
    return {
        "tokenized": m.Tokenized(rids[0], ids),
        "scheduled": m.Scheduled(rids[0], ids, SamplingParams(max_new_tokens=64, seed=3)),
        "step_64": m.StepTokens(1, seqs, stepped_at=1.0),
        "deltas_64": m.StreamDeltas(deltas, stepped_at=1.0),
    }


def frame(encoded: bytes | list[bytes | memoryview]) -> bytearray:
    if isinstance(encoded, bytes):
        return bytearray(encoded)
    return bytearray(b"".join(bytes(b) for b in encoded))


def best_us(fn: Callable[[], Any], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6


def bench(number: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, msg in examples().items():
        wrapped = (msg,)  # a tuple is not a registered message: it goes the pickle way
        packed, pickled = frame(codec.dumps(msg)), frame(codec.dumps(wrapped))
        assert packed[0] != pickled[0], "both frames took the same path"
        out[name] = {
            "msgpack_encode_us": best_us(partial(codec.dumps, msg), number),
            "msgpack_decode_us": best_us(partial(codec.loads, packed), number),
            "pickle_encode_us": best_us(partial(codec.dumps, wrapped), number),
            "pickle_decode_us": best_us(partial(codec.loads, pickled), number),
            "msgpack_bytes": len(packed),
            "pickle_bytes": len(pickled),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--number", type=at_least(1), default=2000, help="calls per repeat")
    args = parser.parse_args()
    results = bench(args.number)
    if args.json:
        print(json.dumps(results))
        return
    print(
        f"{'message':10} {'msgpack enc':>11} {'dec µs':>7} {'pickle enc':>10} {'dec µs':>7} "
        f"{'enc gain':>8} {'dec gain':>8} {'bytes mp/pk':>12}"
    )
    for name, r in results.items():
        print(
            f"{name:10} {r['msgpack_encode_us']:11.2f} {r['msgpack_decode_us']:7.2f} "
            f"{r['pickle_encode_us']:10.2f} {r['pickle_decode_us']:7.2f} "
            f"{r['pickle_encode_us'] / r['msgpack_encode_us']:7.1f}x "
            f"{r['pickle_decode_us'] / r['msgpack_decode_us']:7.1f}x "
            f"{int(r['msgpack_bytes']):>5}/{int(r['pickle_bytes'])}"
        )


if __name__ == "__main__":
    main()

"""A seeded, randomized fault run through ``rt.open_engine``: now ``rt-chaos``.

    python tools/fault_run.py --requests 300 --seed 1 [--dtype bfloat16] [--json]

Kept for the command it was (issue 9's note): it runs ``rt-chaos
--in-process`` with SIGKILLs only (``--kills`` per actor, at random frames
and phases), no poison and no hostile requests. Every other option is
rt-chaos's (``python -m rt.chaos --help``); see docs/reliability.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rt.chaos.cli import main as chaos_main


def translate(argv: list[str]) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kills", type=int, default=3, help="kills per actor")
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--timeout", type=float, default=180.0, help="per request, seconds")
    parser.add_argument("--json", action="store_true")
    args, rest = parser.parse_known_args(argv)
    out = [
        "--in-process",
        f"--requests={args.requests}",
        f"--seed={args.seed}",
        f"--fault-count={3 * args.kills}",
        "--kinds=sigkill",
        "--poison=0",
        "--hostile=0",
        f"--dtype={args.dtype}",
        f"--timeout={args.timeout}",
    ]
    if args.concurrency is not None:
        out.append(f"--concurrency={args.concurrency}")
    if args.json:
        out.append("--json")
    return out + rest


if __name__ == "__main__":
    sys.exit(chaos_main(translate(sys.argv[1:])))

"""A seeded run with random actor kills, through ``rt.open_engine``: rt-chaos, in process.

    python tools/fault_run.py --requests 300 --seed 1 [--dtype bfloat16] [--json]

Kept for its old options; the work is rt-chaos's (``rt-chaos --help``):
``--kills K`` is K SIGKILLs per actor (tokenizer, scheduler, detokenizer)
at random frames and steps, no poison flood. Any other option is passed to
rt-chaos as it is (``--hogs 1``, ``--sweep 4``, ``--ring-capacity 4096``).
The same seed replays the same faults and the same requests.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ACTORS = 3  # tokenizer0, scheduler, detokenizer


def translate(argv: list[str]) -> list[str]:
    """fault_run's options → rt-chaos's argv (in process, SIGKILLs only)."""
    from rt.chaos.cli import at_least

    parser = argparse.ArgumentParser(prog="fault_run.py", description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kills", type=at_least(0), default=3, help="kills per actor")
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"))
    parser.add_argument("--timeout", type=float, help="per request, seconds")
    parser.add_argument("--json", action="store_true")
    args, rest = parser.parse_known_args(argv)
    out = [
        "--in-process",
        f"--requests={args.requests}",
        f"--seed={args.seed}",
        f"--fault-count={args.kills * ACTORS}",
        "--kinds=sigkill",
        "--poison=0",
    ]
    for name in ("concurrency", "dtype", "timeout"):
        if getattr(args, name) is not None:
            out.append(f"--{name}={getattr(args, name)}")
    if args.json:
        out.append("--json")
    return out + rest


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from rt.chaos.cli import main as rt_chaos

    return rt_chaos(translate(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())

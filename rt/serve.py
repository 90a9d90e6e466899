"""The ``rt-serve`` console script."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rt-serve", description=__doc__)
    parser.add_argument("--model-path", default=None, help="a Hugging Face model directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.parse_args(argv)
    print(
        "rt-serve: the serving pipeline (tokenizer, scheduler, detokenizer actors and the "
        "HTTP app) is not built yet, so nothing is served. This command becomes real with "
        "issue 5.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""How long a running rt-serve leaves /health unanswered beside one hostile load:
a batch of many one-character prompts in one request, or many big bodies at once.

    .venv/bin/python tools/bench_stall.py --url http://127.0.0.1:30000 --batch 65536
    .venv/bin/python tools/bench_stall.py --url http://127.0.0.1:30000 --big-bodies 20

A prober asks /health every 0.1 s on a kept-alive connection while the load runs;
it prints the load's time and status, /health's longest wait, its waits over 1 s,
and the probes that failed (a kept-alive connection dropped, a request lost).
"""

from __future__ import annotations

import argparse
import json
import time

import httpx
import trio


async def measure(url: str, path: str, bodies: list[bytes]) -> None:
    waits: list[float] = []
    failed: list[str] = []
    statuses: list[int] = []
    done = trio.Event()

    async def probe(client: httpx.AsyncClient) -> None:
        while not done.is_set():
            start = time.monotonic()
            try:
                await client.get("/health")
            except httpx.HTTPError as err:
                failed.append(type(err).__name__)
            waits.append(time.monotonic() - start)
            await trio.sleep(0.1)

    async def send(client: httpx.AsyncClient, body: bytes) -> None:
        headers = {"content-type": "application/json"}
        statuses.append((await client.post(path, content=body, headers=headers)).status_code)

    limits = httpx.Limits(max_connections=len(bodies) + 1)
    async with (
        httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as load,
        httpx.AsyncClient(base_url=url, timeout=900) as prober,
    ):
        await prober.get("/health")  # (its connection open before the load)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe, prober)
            start = time.monotonic()
            async with trio.open_nursery() as senders:
                for body in bodies:
                    senders.start_soon(send, load, body)
            took = time.monotonic() - start
            done.set()
    print(
        f"load: {len(bodies)} request(s) to {path}, {took:.1f} s, statuses {sorted(set(statuses))}"
    )
    print(
        f"/health: {len(waits)} probes, longest wait {max(waits):.2f} s, "
        f"{sum(w > 1 for w in waits)} over 1 s, failed {failed or 'none'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="a running rt-serve")
    load = parser.add_mutually_exclusive_group(required=True)
    load.add_argument("--batch", type=int, help="one /v1/completions of this many prompts")
    load.add_argument(
        "--big-bodies", type=int, help="this many bodies of 15 MiB of token ids at once"
    )
    args = parser.parse_args()
    if args.batch:
        body = {"prompt": ["a"] * args.batch, "max_tokens": 1}
        bodies = [json.dumps(body).encode()]
    else:  # (a prompt over the context: refused, after it was parsed)
        body = {"prompt": [7] * ((15 << 20) // 2 - 1000), "max_tokens": 1}
        bodies = [json.dumps(body, separators=(",", ":")).encode()] * args.big_bodies
    trio.run(measure, args.url.rstrip("/"), "/v1/completions", bodies)


if __name__ == "__main__":
    main()

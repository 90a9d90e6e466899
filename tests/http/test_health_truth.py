"""/health is never 200 while a request cannot complete: a scheduler step that
hangs in its worker thread (the actor's trio thread beats on, so neither its exit
nor its silence shows it), and an actor whose trio thread is stuck (silent)."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio
from serverlib import Server, start_server, write_plan

WATCHDOG_S = 20


def hanging_server(tmp_path: Path, actor: str, point: str) -> Server:
    """rt-serve (the null model) whose ``actor`` blocks its thread (sleeps) at its
    first pass of ``point``, in its first incarnation."""
    rule = {"actor": actor, "point": point, "action": "hang", "hang": "sleep", "times": 1}
    plan = write_plan(tmp_path / "hang.json", {"seed": 1, "faults": [{**rule, "incarnation": 1}]})
    return start_server(
        "--load-format=null", f"--fault-plan={plan}", f"--watchdog-timeout={WATCHDOG_S}"
    )


async def wait_for_503(client: httpx.AsyncClient, within_s: float) -> tuple[float, str]:
    """How long until /health says 503, and why."""
    start = trio.current_time()
    with trio.fail_after(within_s):
        while (answer := await client.get("/health")).status_code != 503:
            await trio.sleep(0.1)
    return trio.current_time() - start, answer.json()["reason"]


async def test_health_is_503_while_a_step_hangs(tmp_path: Path) -> None:
    """A step that hung left /health at 200 until the watchdog killed the scheduler
    (35 s with the default 30 s watchdog). The step that hangs is a /health_generate
    probe's: abort_all ends it too (it said 200 "ok" with no token made)."""
    server = hanging_server(tmp_path, "scheduler", "forward")
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=90) as client:
            async with trio.open_nursery() as nursery:
                answers: list[httpx.Response] = []

                async def probe() -> None:
                    answers.append(await client.get("/health_generate"))

                nursery.start_soon(probe)
                took, reason = await wait_for_503(client, WATCHDOG_S)
                assert "the scheduler's step has run for" in reason, reason
                assert took < WATCHDOG_S - 5, took  # not when the watchdog acts
                aborted = await client.post("/abort_request", json={"abort_all": True})
                assert aborted.json() == {"aborted": 1}, aborted.text
            assert answers[0].status_code == 503, answers[0].text
            assert "did not finish: abort_request" in answers[0].text
            with trio.fail_after(60):  # the watchdog's restart
                while (await client.get("/health_generate")).status_code != 200:
                    await trio.sleep(0.1)
    finally:
        server.stop()


async def test_health_is_503_while_an_actor_shows_no_sign_of_life(tmp_path: Path) -> None:
    """A detokenizer whose trio thread is stuck (its timer beats no more, its
    process runs: neither killed nor stopped) makes /health 503 once it has been
    silent SILENT_AFTER_S, well before the watchdog restarts it; the request it
    held then completes."""
    server = hanging_server(tmp_path, "detokenizer", "receive")
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=90) as client:
            assert (await client.get("/health")).status_code == 200
            async with trio.open_nursery() as nursery:
                answers: list[httpx.Response] = []

                async def generate() -> None:
                    body = {
                        "text": "hello",
                        "sampling_params": {"max_new_tokens": 4, "ignore_eos": True},
                    }
                    answers.append(await client.post("/generate", json=body))

                nursery.start_soon(generate)
                took, reason = await wait_for_503(client, WATCHDOG_S)
                assert "detokenizer has shown no sign of life" in reason, reason
                assert took < WATCHDOG_S - 5, took  # not when the watchdog acts
            assert answers[0].status_code == 200, answers[0].text
            assert answers[0].json()["meta_info"]["completion_tokens"] == 4
            with trio.fail_after(30):
                while (await client.get("/health")).status_code != 200:
                    await trio.sleep(0.1)
    finally:
        server.stop()

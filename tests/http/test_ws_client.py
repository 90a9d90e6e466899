"""rt.client against a real rt-serve, where only a real server shows what the
client must do: a server that stops answering, a frame over the client's limit."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import pytest
import trio
from serverlib import SLOW_STEPS, Server, running_server, write_plan

from rt import errors
from rt.client import RemoteError, connect

LONG = {"max_new_tokens": 400, "ignore_eos": True}  # 20 ms a step: 8 s


@pytest.mark.slow
async def test_a_frozen_server_fails_the_calls_on_its_connection_as_broken(tmp_path) -> None:
    """SIGSTOP: the kernel still acknowledges every byte, so nothing but a ping
    tells the client that no answer is coming; without one its calls hung for good."""
    plan = write_plan(tmp_path / "slow.json", SLOW_STEPS)
    with running_server("--load-format=null", f"--fault-plan={plan}") as server:
        async with connect(server.url, ping_interval=0.5, ping_timeout=2.0) as client:
            stream = client.stream("frozen mid-stream", sampling_params=LONG)
            await stream.__anext__()  # a delta: the request is in flight
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                with trio.fail_after(30):
                    with pytest.raises(errors.Broken, match="answered no ping within 2 s"):
                        async for _ in stream:
                            pass
                    with pytest.raises(errors.Broken, match="open a new connection"):
                        await client.generate("and after", sampling_params={"max_new_tokens": 1})
                assert client.in_flight == 0
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
        async with connect(server.url) as client:  # the server, thawed, serves on
            out = await client.generate("thawed", sampling_params={"max_new_tokens": 2})
            assert len(out["output_ids"]) == 2


async def test_a_live_server_answers_the_pings(default_server: Server) -> None:
    async with connect(default_server.url, ping_interval=0.05, ping_timeout=5.0) as client:
        await trio.sleep(0.5)  # ten pings, each answered
        params = {"max_new_tokens": 3, "ignore_eos": True}
        out = await client.generate("still here", sampling_params=params)
        assert len(out["output_ids"]) == 3


async def test_a_frame_over_max_message_size_says_which_limit_to_raise(
    default_server: Server,
) -> None:
    body = {"return_logprob": True, "top_logprobs_num": 5}
    params = {"max_new_tokens": 16, "ignore_eos": True}
    async with connect(default_server.url) as client:  # the default limit takes it
        out = await client.generate("big frame", sampling_params=params, **body)
        assert len(out["meta_info"]["output_top_logprobs"]) == 16
    async with connect(default_server.url, max_message_size=2048) as client:
        with pytest.raises(errors.Broken, match=r"1009.*over this client's max_message_size"):
            await client.generate("big frame", sampling_params=params, **body)


async def test_what_the_server_refuses_or_cuts_short_ends_the_call() -> None:
    """A frame over the server's --max-body-size was refused for no id: the call
    waited for good. One past the server's own frame limit closes the connection
    (1009), which said to raise this client's limit. With n=2 aborted before a
    token, the answer was one dict, not a list of two."""
    with running_server("--load-format=null", "--max-body-size=100000") as server:
        async with connect(server.url) as client:
            with trio.fail_after(30), pytest.raises(RemoteError, match=r"^413: ") as err:
                await client.generate("x" * 150_000)
            assert err.value.frame["id"] is not None
            out = await client.generate("after", sampling_params={"max_new_tokens": 2})
            assert len(out["output_ids"]) == 2  # the connection goes on
            async with trio.open_nursery() as nursery:
                client_pause(server)
                got: list[Any] = []

                async def call() -> None:
                    params = {"max_new_tokens": 8, "n": 2}
                    got.append(await client.generate("held", sampling_params=params, rid="held"))

                nursery.start_soon(call)
                with trio.fail_after(30):
                    while not server.info()["requests_in_flight"]:
                        await trio.sleep(0.02)
                abort = httpx.post(f"{server.url}/abort_request", json={"rid": "held"}, timeout=30)
                assert abort.json() == {"aborted": 1}
            httpx.post(f"{server.url}/continue_generation", timeout=30).raise_for_status()
            (answer,) = got
            assert isinstance(answer, list) and len(answer) == 2, answer
            assert [a["output_ids"] for a in answer] == [[], []]
            assert {a["meta_info"]["finish_reason"]["type"] for a in answer} == {"abort"}
        async with connect(server.url) as client:
            with trio.fail_after(30), pytest.raises(errors.Broken) as broken:
                await client.generate("x" * 1_200_000)  # (past the limit's slack of 1 MiB)
            assert "the server closed it: a frame sent was over its limit" in str(broken.value)
            assert "max_message_size" not in str(broken.value)


def client_pause(server: Server) -> None:
    answer = httpx.post(f"{server.url}/pause_generation", json={"mode": "in_place"}, timeout=30)
    answer.raise_for_status()


async def test_a_stream_left_from_its_async_with_is_cancelled_at_once(
    default_server: Server,
) -> None:
    """A stream kept in a name (to read its meta_info) and left with ``break`` sent
    no cancel: the server made all its tokens. ``async with`` sends it on leaving."""
    params = {"max_new_tokens": 400, "ignore_eos": True}
    async with connect(default_server.url) as client:
        async with client.stream("left early", sampling_params=params) as stream:
            async for delta in stream:
                assert delta.text is not None
                break
        assert client.in_flight == 0  # (cancelled: no longer routed)
        # the server's side: the request ends with an abort, far from its 400 tokens
        with trio.fail_after(30):
            while default_server.info()["requests_in_flight"]:
                await trio.sleep(0.05)
        assert stream.meta_info is None  # (no done frame read: it left before)


async def test_a_stream_closed_from_another_task_ends_its_reader(default_server: Server) -> None:
    """The reader hung for good (its channel was dropped, never closed); a stream
    read after its async with is an error, not an empty answer; an error in the
    body of its async with comes out as itself."""
    params = {"max_new_tokens": 400, "ignore_eos": True}
    async with connect(default_server.url) as client:
        stream = client.stream("closed by another", sampling_params=params)
        read: list[str] = []

        async def reader() -> None:
            async for delta in stream:
                read.append(delta.text)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                while not read:
                    await trio.sleep(0.01)
                await stream.aclose()
        assert client.in_flight == 0
        async with client.stream("never read", sampling_params=params) as unread:
            pass
        with pytest.raises(errors.Closed, match="closed before it was read"):
            await unread.__anext__()
        got: KeyError | None = None
        with trio.move_on_after(0.5):
            try:
                async with client.stream("raised in", sampling_params=params) as raising:
                    async for _ in raising:
                        time.sleep(0.6)  # (past the deadline: a checkpoint on exit raised
                        raise KeyError("the body's")  # Cancelled, which took its place)
            except KeyError as err:
                got = err
        assert got is not None


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("connect_timeout", -1),
        ("connect_timeout", True),
        ("ping_timeout", 0),
        ("ping_interval", 0),
        ("ping_interval", "1"),
    ],
)
async def test_a_timeout_that_is_no_positive_number_is_refused_by_name(
    option: str, value: object
) -> None:
    with pytest.raises(ValueError, match=f"^{option}: expected a positive number of seconds"):
        async with connect("ws://127.0.0.1:1/ws", **{option: value}):  # type: ignore[arg-type]
            pass


async def test_a_connect_that_times_out_says_so() -> None:
    """The reason was empty ("cannot connect to …: ; is rt-serve listening there?")."""
    with pytest.raises(errors.Broken, match=r": timed out after 1e-06 s; is rt-serve"):
        async with connect("ws://127.0.0.1:1/ws", connect_timeout=1e-6):
            pass

import trio


async def test_trio_mode_runs_async_tests() -> None:
    with trio.fail_after(1):
        await trio.sleep(0)

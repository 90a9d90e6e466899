"""``chat_template`` (rt-serve's ``--chat-template``, SGLang's and vLLM's): a
template of the operator's own in place of the tokenizer's, from a file or
given inline; one that cannot work stops the start, before any process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import trio

import rt
from rt.assets import default_model_path
from rt.tok.load import load_tokenizer

NULL: dict[str, object] = dict(device="cpu", load_format="null", torch_threads=1)
TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}[you]"
CHAT = [{"role": "user", "content": "hello"}]


async def rendered(engine: rt.Engine, **options: object) -> str:
    stream = engine.stream(messages=CHAT, max_new_tokens=1, **options)
    async for _ in stream:
        pass
    assert stream.input_ids is not None
    text = str(load_tokenizer(str(default_model_path())).decode(stream.input_ids))
    return "".join(text.split())


async def test_a_template_from_a_file_or_inline_renders_the_chat(tmp_path: Path) -> None:
    path = tmp_path / "chat.jinja"
    path.write_text(TEMPLATE)
    for given in (str(path), TEMPLATE):
        async with rt.open_engine(**NULL, chat_template=given) as engine:
            assert await rendered(engine) == "[user]hello[you]"
    async with rt.open_engine(**NULL) as engine:  # the tokenizer's own
        assert await rendered(engine) == "<|bos|><|user|>hello<|end|><|assistant|>"


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("/nonexistent.jinja", "cannot be read"),
        ("{% for m in messages %}", "Jinja cannot compile it: Unexpected end of template"),
        ("{{ messages | nosuchfilter }}", "No filter named 'nosuchfilter'"),
    ],
)
async def test_a_template_that_cannot_work_stops_the_start(given: str, says: str) -> None:
    with pytest.raises(rt.errors.ConfigError, match=f"chat_template: .*{says}"):
        async with rt.open_engine(**NULL, chat_template=given):
            pytest.fail("started")
    kids = subprocess.run(["pgrep", "-f", f"--parent {os.getpid()}"], capture_output=True)
    assert not kids.stdout


@pytest.mark.slow
async def test_a_request_that_hangs_the_tokenizer_costs_max_crashes_kills_no_more() -> None:
    """A template that loops on a variable the client sets hangs the tokenizer on
    one request. While it hung, stall detection sent the request again (the
    worker was silent), and each copy, still queued after the request had
    failed, cost one more watchdog kill (one request kept a one-worker server
    from serving for minutes, with the defaults). A worker at work is not sent
    copies: it is killed max_crashes_per_request times, and serves on."""
    looping = "{% for i in range(reps) %}{% for j in range(reps) %}{% endfor %}{% endfor %}"
    options = dict(NULL, chat_template=looping + TEMPLATE, watchdog_timeout=2.0)
    async with rt.open_engine(**options, stall_timeout=4.0) as engine:
        with trio.fail_after(60), pytest.raises(rt.errors.RequestFailedError, match="3 tokenizer"):
            await engine.generate(messages=CHAT, chat_template_kwargs={"reps": 100000})
        await trio.sleep(10.0)  # room for copies to be sent and hang it again
        with trio.fail_after(30):
            out = await engine.generate(messages=CHAT, chat_template_kwargs={"reps": 1})
        assert len(out.output_ids) > 0
        assert engine.supervisor.status().actor("tokenizer0").restart_count == 3

"""``chat_template`` (rt-serve's ``--chat-template``, SGLang's and vLLM's): a
template of the operator's own in place of the tokenizer's, from a file or
given inline; one that cannot work stops the start, before any process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

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

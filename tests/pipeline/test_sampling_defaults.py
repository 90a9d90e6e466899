"""A model's generation_config.json sets the sampling parameters a request leaves
out (``sampling_defaults="model"``, as vLLM and SGLang), unless the engine is
told ``"openai"``. rt read the file's values and used none of them: a model
shipped to sample at temperature 0.6 sampled at 1 without a word."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import rt
from rt.errors import ConfigError

OPTIONS: dict[str, Any] = dict(device="cpu", max_total_tokens=4096, ring_capacity=1 << 20)
PROMPT = "the quick brown"


def with_generation_config(model: Path, where: Path, values: dict[str, Any]) -> Path:
    copy = where / "model"
    shutil.copytree(model, copy)
    path = copy / "generation_config.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**saved, **values}))
    return copy


async def ids(engine: rt.Engine, **params: Any) -> list[int]:
    out = await engine.generate(PROMPT, max_new_tokens=16, **params)
    return list(out.output_ids)


async def test_what_a_request_leaves_out_takes_the_models_generation_config(
    tiny_model: Path, tmp_path: Path
) -> None:
    model = with_generation_config(tiny_model, tmp_path, {"temperature": 50.0, "top_k": 1})
    async with rt.open_engine(str(model), **OPTIONS) as engine:
        assert engine.sampling_defaults == {"temperature": 50.0, "top_k": 1}
        greedy = await ids(engine, temperature=0.0)
        assert await ids(engine, seed=3) == greedy  # top_k 1, from the file
        # the request's own top_k, the file's temperature
        hot = await ids(engine, seed=3, top_k=-1)
        assert hot == await ids(engine, seed=3, top_k=-1, temperature=50.0)
        assert hot != greedy
    async with rt.open_engine(str(model), sampling_defaults="openai", **OPTIONS) as engine:
        assert engine.sampling_defaults == {}
        plain = await ids(engine, seed=3, top_k=-1)
        assert plain == await ids(engine, seed=3, top_k=-1, temperature=1.0) != hot


@pytest.mark.parametrize(
    ("values", "named"),
    [({"temperature": -1}, "temperature"), ({"top_p": 2}, "top_p"), ({"top_k": "few"}, "top_k")],
)
async def test_a_generation_config_no_request_could_take_is_refused_at_start(
    tiny_model: Path, tmp_path: Path, values: dict[str, Any], named: str
) -> None:
    model = with_generation_config(tiny_model, tmp_path, values)
    with pytest.raises(
        ConfigError, match=rf"generation_config\.json: {named}.*--sampling-defaults"
    ):
        async with rt.open_engine(str(model), **OPTIONS):
            pass
    async with rt.open_engine(str(model), sampling_defaults="openai", **OPTIONS) as engine:
        assert await ids(engine, temperature=0.0)  # told to leave the file unread, it does

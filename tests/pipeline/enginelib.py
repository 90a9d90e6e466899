"""What the pipeline's tests share: a null model's options, a fault plan on disk,
and a stream read to its end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import rt

NULL: dict[str, Any] = dict(load_format="null", max_total_tokens=8192)


def plan(tmp_path: Path, *rules: dict[str, Any]) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"seed": 1, "faults": list(rules)}))
    return str(path)


async def collect(engine: rt.Engine, prompt: Any, **options: Any) -> tuple[str, list[int]]:
    text, ids = "", []
    async for chunk in engine.stream(prompt, **options):
        text += chunk.text
        ids += chunk.output_ids
    return text, ids

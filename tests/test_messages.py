"""Every message crosses the rings as MessagePack and comes back exact."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rt import messages as m
from rt.detok.incremental import DetokParams
from rt.gpu.sampling_params import SamplingParams
from rt.shm import codec

IDS = np.arange(1000, 1020, dtype=np.int32)
STATS = m.SchedulerStats(5, 2, 1, 100, 50, 874, True, 0, 3, True, 7, False)
SAMPLING = SamplingParams(
    max_new_tokens=7, temperature=0.5, stop_token_ids=(2, 3), seed=11, logit_bias={5: -1.5}
)
SEQ = m.SeqTokens(
    "r" * 32, 1, 4, (7, 8), "stop", 2, (-0.5, -1.0), [[(1, -0.1), (2, -2.0)]], 20, 4, 11,
    admitted_at=12.5, prompt_logprobs=(-1.5, -0.25), prompt_top_logprobs=[[(3, -0.2)], [(4, -0.1)]],
    attempt=2,
)  # fmt: skip
DELTA = m.SeqDelta(
    "r", 0, 0, (7,), 3, "abc", "stop", "END", None, None, 20, 0, 7, 2, 12.5, (-1.0,), attempt=1
)
REFUSED = m.Refused("q", "ValidationError", "too long")

EXAMPLES: list[m.Message] = [
    m.GenerateRequest("r", text="hello"),
    m.GenerateRequest(
        "r",
        input_ids=(1, 2, 3),
        sampling=SAMPLING,
        detok=DetokParams(False, ("stop", "END")),
        allow_auto_truncate=True,
        priority=3,
    ),
    m.GenerateRequest("r", messages=({"role": "user", "content": "hi"},)),
    m.Scheduled("r", IDS, SAMPLING, 2, (IDS[:3], IDS[:0]), (1,)),
    m.Scheduled("r", IDS, SAMPLING, 0, (IDS[:3],), attempt=3),
    m.Tokenized("r", IDS, 4),
    REFUSED,
    m.Abort("r"),
    m.FinishNow("r"),
    m.Control("pause", 3),
    m.OpenStream("r", 2, IDS[-4:], DetokParams(), IDS[:5], epoch=3, attempt=1),
    m.CloseStream("r/2"),
    SEQ,
    STATS,
    m.StepTokens(9, (SEQ, SEQ), (REFUSED,), STATS, 123.5, epoch=2),
    DELTA,
    m.DetokStats(streams=3, parked=1),
    m.StreamDeltas((DELTA,), (REFUSED,), None, 1.25, ("r/0",), m.DetokStats(1, 0)),
    m.StreamDeltas((), gaps=(("r/0", 3, 1),)),
    m.DetokenizerUp(incarnation=2),
]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, m.Message):
        return type(a) is type(b) and all(
            same(getattr(a, f), getattr(b, f)) for f in a.__struct_fields__
        )
    if isinstance(a, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


def test_every_message_type_has_an_example() -> None:
    assert {type(x) for x in EXAMPLES} == set(m._messages())


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda x: type(x).__name__)
def test_messages_cross_as_messagepack_and_come_back_exact(msg: m.Message) -> None:
    encoded = codec.dumps(msg)
    assert isinstance(encoded, bytes), "fell back to pickle"
    assert encoded[0] in (*range(0x90, 0xA0), 0xDC), "not a MessagePack array"
    out = codec.loads(bytes(encoded))
    assert same(msg, out), out


def test_a_decoded_message_is_its_own_copy() -> None:
    frame = codec.dumps(m.Tokenized("r", IDS.copy()))
    assert isinstance(frame, bytes)
    out = codec.loads(frame)
    out.input_ids[0] = -1  # the pipeline may write into arrays it received
    assert codec.loads(frame).input_ids[0] == 1000


def test_the_codec_benchmark_runs_on_every_example() -> None:
    tool = Path(__file__).resolve().parents[1] / "tools" / "bench_codec.py"
    out = subprocess.run(
        [sys.executable, str(tool), "--json", "--number", "20"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    results = json.loads(out.stdout)
    assert set(results) == {"tokenized", "scheduled", "step_64", "deltas_64"}
    for figures in results.values():
        assert all(value > 0 for value in figures.values())

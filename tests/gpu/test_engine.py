"""Engine core behaviour: policies, limits, finish reasons, abort/finish, validation, null model."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from gpu_testlib import drain, greedy, make_engine, prompts, run_all

from rt.errors import ConfigError, InvalidRequestError
from rt.gpu import EngineConfig, EngineCore, ModelConfig, SamplingParams


def null_engine(path: Path, **kwargs: object) -> EngineCore:
    kwargs.setdefault("max_total_tokens", 4096)
    return EngineCore(EngineConfig(model_path=path, load_format="null", **kwargs))  # type: ignore[arg-type]


def first_admitted(engine: EngineCore) -> str:
    step = engine.step()
    assert step.forward_mode == "extend"
    return step.outputs[0].rid


@pytest.mark.parametrize("policy", ["fcfs", "priority", "lpm"])
def test_policies_pick_the_expected_request(checkpoints: dict[str, Path], policy: str) -> None:
    engine = null_engine(checkpoints["llama"], max_running_requests=1, schedule_policy=policy)
    shared = list(range(10, 50))
    run_all(engine, {"warm": ([*shared, 3], greedy(2))})
    engine.add_request("old", list(range(60, 90)), greedy(2), priority=0)
    engine.add_request("vip", list(range(90, 120)), greedy(2), priority=5)
    engine.add_request("hit", [*shared, 4, 5], greedy(2), priority=1)
    expected = {"fcfs": "old", "priority": "vip", "lpm": "hit"}[policy]
    assert first_admitted(engine) == expected
    drain(engine)
    engine.check_integrity()


def test_max_running_requests_and_prefill_budget(checkpoints: dict[str, Path]) -> None:
    engine = null_engine(checkpoints["llama"], max_running_requests=2, max_prefill_tokens=1000)
    for i, p in enumerate(prompts(4, [20, 20, 20, 20])):
        engine.add_request(f"r{i}", p, greedy(5, ignore_eos=True))
    res = drain(engine, max_steps=1)
    assert (engine.num_running, engine.num_waiting) == (2, 2)
    res = drain(engine, results=res)
    assert all(len(r["tokens"]) == 5 for r in res.values())


def test_a_cpu_step_prefills_2048_prompt_tokens_at_most_by_default(
    checkpoints: dict[str, Path],
) -> None:
    # on the CPU a token costs far more than on a GPU: a step that prefilled 8192 held
    # every running request's next token back for the whole of it
    def config(**kwargs: Any) -> EngineConfig:
        return EngineConfig(model_path=checkpoints["llama"], **kwargs)

    assert config(device="cpu").prefill_chunk == 2048
    assert config(device="cuda").prefill_chunk == 8192
    assert config(chunked_prefill_size=-1).prefill_chunk is None  # no chunking
    assert config(chunked_prefill_size=300).prefill_chunk == 300
    with pytest.raises(ConfigError, match=r"-1 \(no chunking\)"):
        config(chunked_prefill_size=0)
    engine = null_engine(checkpoints["llama"], max_total_tokens=8192, max_running_requests=64)
    for i, p in enumerate(prompts(40, [64] * 40)):
        engine.add_request(f"r{i}", p, greedy(2, ignore_eos=True))
    first = engine.step()
    assert first.num_tokens == 2048
    assert [o.rid for o in first.outputs] == [f"r{i}" for i in range(32)]
    second = engine.step()  # the other 8 (their first token may come from the cache)
    assert [o.rid for o in second.outputs] == [f"r{i}" for i in range(32, 40)]
    unchunked = null_engine(checkpoints["llama"], max_total_tokens=8192, chunked_prefill_size=-1)
    for i, p in enumerate(prompts(40, [64] * 40)):
        unchunked.add_request(f"r{i}", p, greedy(2, ignore_eos=True))
    assert unchunked.step().num_tokens == 40 * 64


def test_a_kv_pool_that_cannot_be_allocated_is_a_config_error(
    checkpoints: dict[str, Path],
) -> None:
    """A ConfigError, which the supervisor does not start again: a MemoryError or
    torch's RuntimeError made the scheduler crash at every start (a loop of restarts,
    then an escalation)."""
    with pytest.raises(ConfigError, match=r"do not fit on cpu .*lower max_total_tokens"):
        make_engine(checkpoints["llama"], max_total_tokens=1 << 40)


def test_finish_reasons_and_min_new_tokens(checkpoints: dict[str, Path]) -> None:
    engine = make_engine(checkpoints["llama"])
    p = prompts(1, [12], seed=5)[0]
    free_run = run_all(engine, {"a": (p, greedy(8, ignore_eos=True))})["a"]["tokens"]
    stop_at = free_run[3]
    res = run_all(engine, {"b": (p, greedy(8, stop_token_ids=(stop_at,)))})["b"]
    assert res["final"].finish_reason == "stop" and res["final"].matched_stop == stop_at
    assert res["tokens"] == free_run[: free_run.index(stop_at) + 1]
    res = run_all(engine, {"c": (p, greedy(8))})["c"]
    assert res["final"].finish_reason == "length" and res["final"].completion_tokens == 8
    # the stop id cannot appear before min_new_tokens
    res = run_all(engine, {"d": (p, greedy(8, stop_token_ids=(stop_at,), min_new_tokens=6))})["d"]
    assert stop_at not in res["tokens"][:6]


def test_allowed_token_ids_only_and_with_min_new_tokens(checkpoints: dict[str, Path]) -> None:
    """vLLM's allowed_token_ids: only those are drawn, greedy or sampled. Where each of
    them is a stop id, min_new_tokens cannot keep them all out: they are drawn (not
    stopped at) until it is met; suppressing them left nothing, and id 0 was drawn."""
    engine = make_engine(checkpoints["llama"])
    p = prompts(1, [12], seed=5)[0]
    free_run = run_all(engine, {"a": (p, greedy(8, ignore_eos=True))})["a"]["tokens"]
    allowed = tuple(t for t in range(3, 40) if t not in free_run)[:5]
    sampled = SamplingParams(max_new_tokens=8, ignore_eos=True, seed=1, allowed_token_ids=allowed)
    stops = greedy(8, stop_token_ids=allowed[:2], allowed_token_ids=allowed[:2], min_new_tokens=3)
    res = run_all(
        engine,
        {
            "greedy": (p, greedy(8, ignore_eos=True, allowed_token_ids=allowed)),
            "sampled": (p, sampled),
            "stops": (p, stops),
        },
    )
    assert set(res["greedy"]["tokens"]) <= set(allowed) and len(res["greedy"]["tokens"]) == 8
    assert set(res["sampled"]["tokens"]) <= set(allowed) and len(res["sampled"]["tokens"]) == 8
    # the third token meets min_new_tokens, and stops it
    assert len(res["stops"]["tokens"]) == 3 and set(res["stops"]["tokens"]) <= set(allowed[:2])
    assert res["stops"]["final"].finish_reason == "stop"


def test_abort_and_external_finish(checkpoints: dict[str, Path]) -> None:
    engine = make_engine(checkpoints["qwen2"], chunked_prefill_size=8)
    ps = prompts(3, [30, 10, 10], seed=6)
    engine.add_request("chunked", ps[0], greedy(50, ignore_eos=True))
    engine.add_request("running", ps[1], greedy(50, ignore_eos=True))
    engine.add_request("waiting", ps[2], greedy(50, ignore_eos=True))
    engine.step()  # the first chunk of "chunked" only
    assert engine.chunked is not None
    engine.abort("chunked")
    engine.abort("waiting")
    engine.abort("unknown")
    step = engine.step()
    reasons = {o.rid: o.finish_reason for o in step.outputs if o.finish_reason}
    assert reasons == {"chunked": "abort", "waiting": "abort"}
    engine.check_integrity()
    res = drain(engine, max_steps=3)
    engine.finish("running")
    res = drain(engine, results=res)
    assert res["running"]["final"].finish_reason == "finish"
    assert 0 < len(res["running"]["tokens"]) < 50
    assert not engine.has_work
    # the rid can be reused once finished
    run_all(engine, {"running": (ps[1], greedy(2))})
    # one of n samples (a stop string the frontend matched): the others go on
    engine.add_request("n3", ps[1], SamplingParams(n=3, max_new_tokens=30, ignore_eos=True))
    res = drain(engine, max_steps=3)
    engine.finish("n3", 1)
    res = drain(engine, results=res)
    assert res["n3#1"]["final"].finish_reason == "finish"
    assert 0 < len(res["n3#1"]["tokens"]) < 30
    for key in ("n3", "n3#2"):
        assert res[key]["final"].finish_reason == "length"
        assert len(res[key]["tokens"]) == 30
    assert not engine.has_work
    engine.check_integrity()


def test_ending_fifty_thousand_samples_at_once_is_linear(checkpoints: dict[str, Path]) -> None:
    """A client leaving 100 prompts of n=1024: each ended sample took itself out of
    the running and waiting lists one list walk at a time, which held the step
    that applied the aborts for 35 s, and the watchdog killed the scheduler.
    Aborted last-queued first (each walk then went the whole way), these 51,200
    took 24 s; now a fraction of a second (a wide margin here)."""
    engine = null_engine(checkpoints["llama"], max_total_tokens=1 << 20, max_running_requests=256)
    n, prompts = 1024, 50
    for i in range(prompts):
        engine.add_request(f"r{i}", [5, 6, 7, 8 + i], SamplingParams(max_new_tokens=4, n=n))
    for _ in range(3):  # some running, some finished, most waiting
        engine.step()
    left = sum(len(children) for children in engine.reqs.values())
    assert left > 40_000
    for i in reversed(range(prompts)):
        engine.abort(f"r{i}")
    started = time.perf_counter()
    out = engine.step()
    assert time.perf_counter() - started < 3.0
    assert sum(o.finish_reason == "abort" for o in out.outputs) == left
    assert not engine.reqs and not engine.running and not engine.waiting and not engine.has_work
    engine.check_integrity()


def test_a_request_leaves_once_its_last_sample_ends(checkpoints: dict[str, Path]) -> None:
    engine = null_engine(checkpoints["llama"])
    engine.add_request("r", [5, 6, 7], SamplingParams(max_new_tokens=50, n=3, ignore_eos=True))
    engine.step()
    engine.finish("r", 1)
    engine.step()
    assert "r" in engine.reqs and len(engine.running) == 2
    engine.finish("r", 0)
    engine.finish("r", 0)  # twice: counted once
    engine.step()
    assert "r" in engine.reqs and len(engine.running) == 1
    engine.abort("r")
    ended = {o.index: o.finish_reason for o in engine.step().outputs if o.finish_reason}
    assert ended == {2: "abort"} and "r" not in engine.reqs and not engine.running
    engine.check_integrity()


def test_add_request_validation(checkpoints: dict[str, Path]) -> None:
    engine = null_engine(checkpoints["llama"])
    with pytest.raises(InvalidRequestError, match="at least one token"):
        engine.add_request("a", [], greedy(2))
    with pytest.raises(InvalidRequestError, match=r"token ids in \[0, 256\), got 300"):
        engine.add_request("a", [1, 300], greedy(2))
    with pytest.raises(InvalidRequestError, match="top_k"):
        engine.add_request("a", [1], SamplingParams(top_k=1.5))  # type: ignore[arg-type]
    engine.add_request("a", [1, 2], greedy(2))
    with pytest.raises(InvalidRequestError, match="already in flight"):
        engine.add_request("a", [1, 2], greedy(2))
    # a resubmission: one sequence of prior tokens per child, valid children, room left
    with pytest.raises(InvalidRequestError, match=r"per child \(n=2\) or none, got 1"):
        engine.add_request("b", [1], greedy(4, n=2), output_ids=[[3]])
    with pytest.raises(InvalidRequestError, match=r"finished: expected child indices in \[0, 2\)"):
        engine.add_request("b", [1], greedy(4, n=2), finished=(2,))
    with pytest.raises(InvalidRequestError, match=r"output_ids\[1\]: .* in \[0, 256\), got 256"):
        engine.add_request("b", [1], greedy(4, n=2), output_ids=[[3], [256]])
    with pytest.raises(InvalidRequestError, match=r"fewer than max_new_tokens=4 .* got 4"):
        engine.add_request("b", [1], greedy(4), output_ids=[[3, 4, 5, 6]])
    assert "b" not in engine.reqs
    with pytest.raises(ConfigError, match="schedule_policy"):
        EngineConfig(model_path=checkpoints["llama"], schedule_policy="sjf")
    with pytest.raises(ConfigError, match="needs CUDA and the flashinfer-python package"):
        make_engine(checkpoints["llama"], attention_backend="flashinfer")


def test_null_model_emits_fixed_tokens_without_forward(checkpoints: dict[str, Path]) -> None:
    cfg = ModelConfig.from_dir(checkpoints["llama"])
    engine = EngineCore(
        EngineConfig(model_config=cfg, load_format="null", max_total_tokens=384, page_size=16)
    )
    res = run_all(engine, {f"r{i}": (p, greedy(20)) for i, p in enumerate(prompts(8, [30] * 8))})
    assert all(len(r["tokens"]) == 20 for r in res.values())
    assert res["r0"]["tokens"] == res["r1"]["tokens"]  # a function of the position only
    assert engine.num_retractions > 0  # 8 × 50 tokens do not fit 384 with pages of 16


def test_abort_from_another_thread_while_stepping(checkpoints: dict[str, Path]) -> None:
    """The scheduler actor steps in a worker thread and aborts from its own."""
    import threading

    engine = null_engine(checkpoints["llama"])
    for i, p in enumerate(prompts(4, [10, 12, 14, 16])):
        engine.add_request(f"r{i}", p, greedy(400, ignore_eos=True))
    results: dict[str, dict[str, Any]] = {}
    worker = threading.Thread(target=lambda: results.update(drain(engine)))
    worker.start()
    for i in range(4):
        engine.abort(f"r{i}")
    worker.join(timeout=60)
    assert not worker.is_alive() and not engine.has_work
    assert all(r["final"].finish_reason in ("abort", "length") for r in results.values())
    engine.check_integrity()


def test_pool_sized_from_memory_fraction(checkpoints: dict[str, Path]) -> None:
    engine = EngineCore(
        EngineConfig(
            model_path=checkpoints["llama"],
            load_format="null",
            mem_fraction=0.01,
            max_running_requests=2,
        )
    )
    # capped at every running request at full context (2 × 512 here)
    assert 0 < engine.max_total_tokens <= 2 * 512
    run_all(engine, {"a": ([5, 6, 7], greedy(4))})


def test_next_step_prefills_is_never_false_before_an_extend(checkpoints: dict[str, Path]) -> None:
    """The scheduler actor runs a step that may prefill off its trio thread: the
    predicate must hold before every extend, through chunking and retraction."""
    cfg = ModelConfig.from_dir(checkpoints["llama"])
    engine = EngineCore(
        EngineConfig(
            model_config=cfg,
            load_format="null",
            max_total_tokens=384,
            page_size=16,
            chunked_prefill_size=24,
        )
    )
    for i, p in enumerate(prompts(8, [30, 50, 5, 70, 12, 30, 40, 9])):
        engine.add_request(f"r{i}", p, greedy(20))
    modes: dict[bool, set[str]] = {True: set(), False: set()}
    while engine.has_work:
        predicted = engine.next_step_prefills
        modes[predicted].add(engine.step().forward_mode)
    assert "extend" not in modes[False]
    assert modes[False] == {"decode"} and "extend" in modes[True]
    assert engine.num_retractions > 0

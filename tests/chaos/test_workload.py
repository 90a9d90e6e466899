"""The workload: request i of seed s is a pure function of (s, i)."""

from __future__ import annotations

from rt.chaos.workload import WorkloadConfig, draw_request


def test_a_request_is_a_function_of_its_seed_and_index() -> None:
    config = WorkloadConfig(transports=("sse", "ws"), cancel_share=0.3, invalid_share=0.1)
    assert draw_request(1, 5, config) == draw_request(1, 5, config)
    assert [draw_request(1, i, config) for i in range(30)] != [
        draw_request(2, i, config) for i in range(30)
    ]


def test_the_mix_has_greedy_seeded_cancelled_and_long_requests() -> None:
    config = WorkloadConfig(cancel_share=0.2, long_prompt_share=0.1)
    specs = [draw_request(3, i, config) for i in range(200)]
    greedy = [s for s in specs if s.temperature == 0.0]
    seeded = [s for s in specs if s.temperature > 0]
    assert greedy and seeded and all(s.seed is not None for s in seeded)
    assert 20 <= sum(s.cancel_after is not None for s in specs) <= 60
    assert any(len(s.prompt.split()) > 100 for s in specs)
    assert all(s.options()["ignore_eos"] for s in specs)
    assert all(8 <= s.max_new_tokens <= 40 for s in specs)


def test_the_poison_flood_lands_back_to_back_with_one_marker_each() -> None:
    markers = ("POISON-0", "POISON-1", "POISON-2")
    config = WorkloadConfig(poison_markers=markers, poison_at=0.25, poison_span=40)
    specs = [draw_request(4, i, config) for i in range(40)]
    poison = [s for s in specs if s.hostile == "poison"]
    assert [s.index for s in poison] == [10, 11, 12]
    assert [s.marker for s in poison] == list(markers)
    assert all(s.marker in s.prompt for s in poison)


def test_a_scheduler_poison_request_sends_its_marker_as_token_ids() -> None:
    marker = " 7 19 3 40 40 11 "
    config = WorkloadConfig(
        transports=("engine", "sse", "ws"), poison_markers=("POISON-0", marker), poison_at=0.0
    )
    text, ids = draw_request(6, 0, config), draw_request(6, 1, config)
    assert text.prompt_ids is None and text.body()["text"] == text.engine_prompt()
    assert ids.hostile == "poison" and ids.marker == marker and ids.prompt_ids is not None
    assert f" {' '.join(map(str, ids.prompt_ids))} ".endswith(marker)  # as the key is written
    assert ids.engine_prompt() == list(ids.prompt_ids)
    body = ids.body()
    assert body["input_ids"] == list(ids.prompt_ids) and "text" not in body


def test_hostile_requests_are_invalid_or_fuzzed_and_never_cancelled() -> None:
    config = WorkloadConfig(transports=("sse", "ws", "engine"), invalid_share=0.2, fuzz_share=0.2)
    specs = [draw_request(5, i, config) for i in range(300)]
    invalid = [s for s in specs if s.hostile == "invalid"]
    fuzz = [s for s in specs if s.hostile == "fuzz"]
    assert invalid and fuzz
    assert all(s.transport != "engine" for s in fuzz)  # fuzzed bodies are HTTP's
    assert all(s.cancel_after is None for s in invalid + fuzz)
    assert not any("\ud800" in s.prompt for s in invalid if s.transport == "ws")

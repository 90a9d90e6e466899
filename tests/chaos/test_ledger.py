"""The ledger: JSON lines written through, read back, and viewed per request."""

from __future__ import annotations

from pathlib import Path

from rt.chaos.ledger import Ledger


def test_events_are_written_through_and_read_back(tmp_path: Path) -> None:
    clock = iter([100.0, 100.5, 101.0, 102.0]).__next__
    ledger = Ledger(tmp_path / "l.jsonl", clock=clock)
    ledger.write("invoke", req=1, spec={"prompt": "lone \ud800"})
    ledger.write("delta", req=1, index=0, text="a", ids=[5])
    ledger.write("end", req=1, state="completed", ids=[5], text="a")
    ledger.close()
    again = Ledger.load(tmp_path / "l.jsonl")
    assert again.events == ledger.events
    (rec,) = again.requests().values()
    assert rec.invoked_at == 0.5 and rec.first_token_at == 1.0 and rec.state == "completed"
    assert rec.spec["prompt"] == "lone \ud800"
    assert rec.delta_ids() == [5] and rec.delta_text() == "a"


def test_a_request_with_no_end_is_lost() -> None:
    ledger = Ledger.of([{"ev": "invoke", "t": 0, "req": 3, "spec": {}}])
    assert ledger.requests()[3].state == "lost"

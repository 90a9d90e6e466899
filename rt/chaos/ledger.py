"""The ledger: a history of everything a chaos run did and saw, as JSON lines.

Every event is ``{"ev": kind, "t": seconds since the run began, ...}``:

* ``invoke`` (a request sent: its spec), ``delta`` (what one delta brought:
  ``index``, ``text``, ``ids``), ``end`` (its terminal state, with the final
  text and ids as the client assembled them, or the error);
* ``fault`` (a fault fired: ``id``, ``kind``, ``actor``, ``via``, ``pid``,
  the phase it was drawn for and the one observed when it fired);
* ``actor`` (the monitor saw an actor change state), ``health`` (the health
  answer changed), ``server`` (rt-serve exited), ``note`` (anything else).

The checkers (:mod:`rt.chaos.checks`) and the figures
(:mod:`rt.chaos.figures`) read nothing but this.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

COMPLETED, CANCELLED = "completed", "cancelled"
FAILED_RETRYABLE, FAILED_FINAL = "failed-retryable", "failed-final"
HUNG = "hung"  # the harness gave up waiting: not a terminal state
TERMINAL = (COMPLETED, CANCELLED, FAILED_RETRYABLE, FAILED_FINAL)


@dataclass
class RequestRecord:
    """One request as the ledger tells it."""

    index: int
    spec: dict[str, Any]
    invoked_at: float
    deltas: list[dict[str, Any]] = field(default_factory=list)
    ends: list[dict[str, Any]] = field(default_factory=list)

    @property
    def end(self) -> dict[str, Any] | None:
        return self.ends[0] if self.ends else None

    @property
    def state(self) -> str:
        return self.ends[0]["state"] if self.ends else "lost"

    @property
    def first_token_at(self) -> float | None:
        return next((d["t"] for d in self.deltas if d["ids"]), None)

    def delta_ids(self, index: int = 0) -> list[int]:
        return [i for d in self.deltas if d.get("index", 0) == index for i in d["ids"]]

    def delta_text(self, index: int = 0) -> str:
        return "".join(d["text"] for d in self.deltas if d.get("index", 0) == index)


class Ledger:
    """Append-only; written through to ``path`` (JSON lines) when one is given."""

    def __init__(
        self, path: str | Path | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.events: list[dict[str, Any]] = []
        self._clock = clock
        self.started = clock()
        self._file: IO[str] | None = open(path, "w") if path is not None else None  # noqa: SIM115

    def now(self) -> float:
        return self._clock() - self.started

    def at(self, monotonic: float) -> float:
        """A ``time.monotonic()`` reading as ledger time."""
        return monotonic - self.started

    def write(self, ev: str, t: float | None = None, **fields: Any) -> dict[str, Any]:
        event = {"ev": ev, "t": round(self.now() if t is None else t, 6), **fields}
        self.events.append(event)
        if self._file is not None:
            self._file.write(json.dumps(event) + "\n")
            self._file.flush()
        return event

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @classmethod
    def load(cls, path: str | Path) -> Ledger:
        ledger = cls()
        ledger.events = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
        return ledger

    @classmethod
    def of(cls, events: Iterable[dict[str, Any]]) -> Ledger:
        ledger = cls()
        ledger.events = list(events)
        return ledger

    # ---- views -----------------------------------------------------------------

    def of_kind(self, ev: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["ev"] == ev]

    def requests(self) -> dict[int, RequestRecord]:
        out: dict[int, RequestRecord] = {}
        for e in self.events:
            kind = e["ev"]
            if kind == "invoke":
                out[e["req"]] = RequestRecord(e["req"], e["spec"], e["t"])
            elif kind == "delta" and e["req"] in out:
                out[e["req"]].deltas.append(e)
            elif kind == "end" and e["req"] in out:
                out[e["req"]].ends.append(e)
        return out

    def header(self) -> dict[str, Any]:
        runs = self.of_kind("run")
        return runs[0] if runs else {}

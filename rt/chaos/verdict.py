"""Every checker over one run's ledger, with the references they need.

A :class:`Judge` holds the engine core that computes references (see
:mod:`rt.chaos.reference`) and caches them by request index: a replay of
the same seed (shrinking) sends the same requests, so only new ones cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rt.chaos import checks
from rt.chaos.checks import Finding
from rt.chaos.ledger import CANCELLED, COMPLETED, Ledger, RequestRecord
from rt.chaos.reference import Job, Replayer
from rt.chaos.schedule import Schedule

# logits: the most a token of an honest float32 output trails its run's own draw
# (batch composition and the prefix cache round a logit by ~1e-6)
FLOAT32_TIE = 1e-3


@dataclass
class Verdict:
    findings: list[Finding] = field(default_factory=list)
    checked: int = 0  # outputs compared with a reference

    @property
    def failed(self) -> bool:
        return bool(self.findings)

    def checkers(self) -> set[str]:
        return {f.checker for f in self.findings}


class Judge:
    """``exact``: every output must equal the replayer's (a server on the CPU in float32,
    as the replayer runs it); otherwise only splices are looked for."""

    def __init__(self, replayer: Replayer, exact: bool | None = None) -> None:
        self.replayer = replayer
        self._exact = exact
        self._refs: dict[int, list[int]] = {}
        self._prompts: dict[int, list[int]] = {}

    @property
    def exact(self) -> bool:
        if self._exact is not None:
            return self._exact
        return self.replayer.dtype == "float32"

    def judge(self, ledger: Ledger, schedule: Schedule) -> Verdict:
        verdict = Verdict()
        poison = set(schedule.poison_markers())
        verdict.findings += checks.terminal(ledger)
        poison_faults = frozenset(f.id for f in schedule.faults if f.match is not None)
        verdict.findings += checks.outcomes(ledger, poison, poison_faults)
        verdict.findings += checks.streams(ledger, self.replayer.decode)
        verdict.findings += checks.engine(ledger)
        outputs = [r for r in ledger.requests().values() if _checkable(r)]
        verdict.findings += self._prompt_tokens(outputs)
        if self.exact:
            refs = self.references(outputs)
            found = checks.against_reference(ledger, refs)
            verdict.findings += [f for f in found if not self._at_a_tie(f, ledger, refs)]
            verdict.checked = len(outputs)
        else:
            verdict.findings += checks.no_splicing(ledger, self._margins)
            verdict.checked = len(outputs)
        return verdict

    def job(self, rec: RequestRecord) -> Job:
        if rec.index not in self._prompts:
            ids = rec.spec.get("prompt_ids")
            self._prompts[rec.index] = (
                list(ids) if ids is not None else self.replayer.encode(rec.spec["prompt"])
            )
        options = {
            "max_new_tokens": rec.spec["max_new_tokens"],
            "ignore_eos": True,
            "temperature": rec.spec["temperature"],
        }
        if rec.spec["temperature"] > 0:
            options.update(top_p=rec.spec["top_p"], seed=rec.spec["seed"])
        return Job(str(rec.index), self._prompts[rec.index], options)

    def references(self, recs: list[RequestRecord]) -> dict[int, list[int]]:
        """Float32: the uninterrupted runs, batched (the core is batch-invariant there)."""
        missing = [r for r in recs if r.index not in self._refs]
        if missing:
            got = self.replayer.reference([self.job(r) for r in missing])
            self._refs.update({int(k): v for k, v in got.items()})
        return {r.index: self._refs[r.index] for r in recs}

    def _margins(self, rec: RequestRecord, ids: Sequence[int]) -> list[float]:
        return self.replayer.margins(self.job(rec), ids)

    def _at_a_tie(self, finding: Finding, ledger: Ledger, refs: dict[int, list[int]]) -> bool:
        """A float32 divergence that is no fault's: every token of the output is
        its run's own draw, to within FLOAT32_TIE. In float32 the core is
        batch-invariant but for exact ties: where the best two logits are ~1 ulp
        apart (4.8e-7 in one found by rt-chaos), whether a prefix came from the
        cache or the batch held another request decides between them. A lost,
        repeated or spliced token trails by whole logits."""
        if finding.checker != "reference" or finding.req is None:
            return False
        rec = ledger.requests()[finding.req]
        ids = list((rec.end or {}).get("ids", []))
        if rec.state == COMPLETED and len(ids) != len(refs[rec.index]):
            return False  # tokens lost or added, not a token for another
        try:
            margins = self._margins(rec, ids)
        except ValueError:  # a draw the margins do not model: the finding stands
            return False
        return max(margins, default=0.0) <= FLOAT32_TIE

    def _prompt_tokens(self, recs: list[RequestRecord]) -> list[Finding]:
        """The engine tokenized the prompt as the replays do (else a reference is moot)."""
        out = []
        for rec in recs:
            said = (rec.end or {}).get("prompt_tokens")
            if said is not None and said != len(self.job(rec).prompt_ids):
                out.append(
                    Finding(
                        "mix-up",
                        f"{said} prompt tokens reported, {len(self.job(rec).prompt_ids)} in its prompt",
                        rec.index,
                    )
                )
        return out


def _checkable(rec: RequestRecord) -> bool:
    return rec.spec.get("hostile") is None and rec.state in (COMPLETED, CANCELLED)

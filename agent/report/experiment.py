"""One experiment of a report: a run of the goal with its card, its result and the decisions it led to."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.candidates import change_words
from core.summary import Summary
from core.trial import TrialResult
from state.snapshots import Decision, Run


@dataclass(frozen=True)
class Experiment:
    """One run of the goal with its card, its result and the decisions it led to."""

    index: int
    run: Run
    card: dict[str, Any]
    station: str | None  # the run's frozen station (executor content hash)
    parent: str | None  # the parent's station hash where a run of the parent froze one
    result: TrialResult | None
    outcome: Decision | None  # the decision judged from this run
    decisions: tuple[Decision, ...]  # every decision naming this run (quality gate included)
    ruled_out: str
    card_hours: float
    run_dir: Path | None = None  # the result's run directory, resolved against the report's base folder

    @property
    def summary(self) -> Summary | None:
        return self.result.summary if self.result else None

    @property
    def verdict(self) -> str:
        return self.result.verdict.kind if self.result else "no result"

    @property
    def change(self) -> str:
        return change_words(self.card, "→") or "none (measure the parent)"

    @property
    def slo_violations(self) -> list[str]:
        return list(((self.outcome.data or {}).get("figures") or {}).get("slo_violations") or []) if self.outcome else []

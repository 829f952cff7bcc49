"""The executor's one side-effecting call: run_trial(TrialSpec) -> TrialResult.

The planner builds a TrialSpec from a candidate card; the executor runs the phases
(lock, prepare, deploy, health, warmup, load, collect, validate, release) and returns a TrialResult.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.evidence import Evidence
from core.summary import Contract, Summary, Verdict

PHASES = ("lock", "prepare", "deploy", "health", "warmup", "load", "collect", "validate", "release")
Stage = Literal["screen", "confirm", "baseline", "restore"]


class TrialSpec(BaseModel):
    model_config = ConfigDict(frozen=True)
    run_id: str  # idempotency key: the same run_id never launches a second load
    goal_id: str
    target: str  # target name from the target definitions (sim, local:..., ssh:...)
    scenario: str
    knobs: dict[str, Any]  # the full station: server knobs + load knobs (concurrency, request_rate)
    parent_knobs: dict[str, Any] | None = None  # the warm service's station (decides restart or not)
    stage: Stage = "screen"
    n: int
    warmup: int = 0
    seed: int = 0
    faults: list[str] = Field(default_factory=list)  # simulator fault injection (tests)
    profile_capture: bool = False
    contract: Contract | None = None  # the goal's contract: the verdict judges the run against it
    slos: dict[str, float] | None = None  # per-request SLOs for goodput (ttft_ms, tpot_ms, e2e_ms)


class CostEntry(BaseModel):
    model_config = ConfigDict(frozen=True)
    what: Literal["restart", "weight_load", "warmup", "load", "relayout", "profile", "collect"]
    seconds: float
    cards: int

    @property
    def card_hours(self) -> float:
        return self.seconds * self.cards / 3600.0


class TrialResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    run_id: str
    verdict: Verdict
    summary: Summary | None = None
    evidence: Evidence = Field(default_factory=Evidence)  # digest of engine metrics, batches, breakdown
    costs: list[CostEntry] = Field(default_factory=list)
    run_dir: str | None = None
    station_hash: str | None = None
    source_identity: str | None = None
    data_version: str | None = None
    healthy_after: bool = True
    failed_phase: str | None = None
    error: str | None = None

    @property
    def card_hours(self) -> float:
        return sum(c.card_hours for c in self.costs)

"""Frozen snapshots the store hands out. Callers never see ORM rows, so nothing outside `state/`
can change the database by mutating an object.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.journal import PhaseRecord  # noqa: F401  (re-exported: phases() returns these)
from core.trial import TrialResult
from state.goal import GoalSpec
from state.lifecycle import OutcomeKind, WaitingFor

DecisionKind = Literal["baseline", "new_best", "tradeoff", "negative", "promising", "quality_pending",
                       "quality_passed", "quality_failed", "fault", "restore", "stop", "note",
                       "rejected", "ask", "extension"]
InstructionKind = Literal["pause", "resume", "stop", "one_more_round", "restore"]
GivenBy = Literal["person", "table", "flag"]  # an approval's giver: a person, the authorisation table, --auto-approve


class _Snap(BaseModel):
    model_config = ConfigDict(frozen=True)


class Goal(_Snap):
    id: str
    name: str
    spec: GoalSpec
    spec_hash: str
    status: str
    status_reason: str | None = None
    waiting_for: WaitingFor | None = None  # what a waiting goal waits for (None unless status is "waiting")
    created_at: datetime
    updated_at: datetime

    @property
    def waits_for_extension(self) -> bool:
        """The loop asked a person for a budget extension and waits for the answer."""
        return self.status == "waiting" and self.waiting_for is WaitingFor.BUDGET_EXTENSION


class Station(_Snap):
    hash: str
    engine: str
    scenario: str
    target: str
    data_version: str
    source_identity: str
    knobs: dict[str, Any]


class Candidate(_Snap):
    id: int
    goal_id: str
    card: dict[str, Any]
    card_hash: str
    knob: str | None = None
    value: Any = None
    parent_hash: str | None = None
    cost_class: str | None = None
    stage: str
    status: str
    status_reason: str | None = None
    created_at: datetime
    updated_at: datetime


class Run(_Snap):
    id: str
    goal_id: str | None
    candidate_id: int | None
    stage: str
    n: int
    target: str
    spec: dict[str, Any]
    station_hash: str | None = None
    status: str
    status_reason: str | None = None
    created_at: datetime
    updated_at: datetime


class Result(_Snap):
    run_id: str
    goal_id: str | None
    verdict: str
    result: TrialResult
    station_hash: str | None = None
    created_at: datetime

    @property
    def valid(self) -> bool:
        return self.verdict == "valid"


class Decision(_Snap):
    id: int
    goal_id: str
    kind: str
    candidate_id: int | None = None
    run_id: str | None = None
    station_hash: str | None = None
    changed: bool = False  # did this experiment change a decision (best, frontier, a closed hypothesis)?
    text: str = ""
    data: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime


class Approval(_Snap):
    id: int
    candidate_id: int
    card_hash: str
    decision: Literal["approve", "reject"]
    who: str
    reason: str | None = None
    context: dict[str, Any] | None = None  # {"deadline_passed", "card_hours_left", "experiments_left"} when given
    given_by: GivenBy = "person"
    created_at: datetime

    @property
    def automatic(self) -> bool:
        """An approval the loop gave itself (the authorisation table's `auto`, or --auto-approve): no person's."""
        return self.given_by != "person"


class Instruction(_Snap):
    id: int
    goal_id: str
    kind: str
    count: int | None = None  # rounds asked for (one_more_round)
    remaining: int | None = None  # rounds still to run; 0 = fulfilled, the loop stops
    knobs: dict[str, Any] = Field(default_factory=dict)
    restore: str | None = None  # station hash to go back to
    who: str
    text: str | None = None
    active: bool = True
    created_at: datetime
    # what became of it, set once: "done: …", "superseded by N (kind, who) before it took effect", "refused: …",
    # "failed: …" (a restore whose station did not come back healthy);
    # None while it waits or is in force
    outcome: str | None = None
    outcome_at: datetime | None = None
    outcome_kind: OutcomeKind | None = None  # the outcome's kind (what code branches on)
    superseded_by: int | None = None  # the instruction that replaced it (outcome_kind superseded)


class Conditions(_Snap):
    """When a negative applies: it was negative for this scenario, parent, source and data."""

    scenario: str
    parent_hash: str | None = None
    source_identity: str | None = None
    data_version: str | None = None


class Negative(_Snap):
    id: int
    goal_id: str | None
    knob: str
    value: Any
    conditions: Conditions
    run_id: str | None = None
    candidate_id: int | None = None
    reason: str = ""
    created_at: datetime


class NegativeMatch(_Snap):
    """Answer of find_negative: `same` (do not repeat), `changed` (may retry; `changed` names which
    conditions differ) or `none` (never tried)."""

    status: Literal["same", "changed", "none"]
    negative: Negative | None = None
    changed: tuple[str, ...] = ()

    @property
    def blocks(self) -> bool:
        return self.status == "same"


class LedgerEntry(_Snap):
    goal_id: str | None
    run_id: str
    what: str
    seconds: float
    cards: int
    card_hours: float
    created_at: datetime


class Lease(_Snap):
    target: str
    holder: str | None
    epoch: int
    expires_at: float


class Veto(_Snap):
    """A change a person rejected (source `person`) or the authorisation table denied (`authorisation`)."""

    id: int
    goal_id: str
    candidate_id: int | None = None
    scenario: str
    knob: str | None = None
    value: Any = None
    parent_hash: str
    data_version: str | None = None
    source_identity: str | None = None
    source: Literal["person", "authorisation"]
    who: str
    reason: str = ""
    created_at: datetime


class Extension(_Snap):
    id: int
    goal_id: str
    decision: Literal["grant", "refuse"]
    card_hours: float = 0.0
    experiments: int = 0
    who: str
    reason: str | None = None
    created_at: datetime

"""Request and response bodies of the REST API (what OpenAPI documents)."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from agent.loop.progress import Progress, Ranking
from core.evidence_parts import Drift
from state import snapshots
from state.reasons import check_reason


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


# a person's reason, judged as every channel judges it (state/reasons.py): its white space folded, then it must say
# something and fit the one length limit; refused with 422 in the words every channel uses, never recorded as a
# decision with nothing behind it, and stored folded
Reason = Annotated[str, AfterValidator(check_reason)]


class GoalOut(BaseModel):
    id: str
    name: str
    status: str = Field(description="running | waiting | paused | stopped | done, or failed: the loop raised and "
                                     "no retry helped; status_reason has the error; resume the goal to retry")
    status_reason: str | None = None
    worker_state: str | None = Field(None, description="the work queue's view: ready | claimed | idle | failed")
    target: str
    scenario: str
    spec_hash: str
    spec: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    budget: "BudgetOut" = Field(description="card-hours and experiments used so far, and the limits")
    progress: Progress | None = Field(None, description="the experiment running now: phase, elapsed and expected "
                                                        "time, requests done / N during the load; null when none runs")


class CandidateOut(BaseModel):
    id: int
    goal_id: str
    card: dict[str, Any]
    card_hash: str
    status: str
    status_reason: str | None = None
    stage: str
    cost_class: str | None = None
    awaiting_approval: bool = False
    est_card_hours: float | None = Field(None, description="estimated card-hours: the planner's, else the cost "
                                                           "model's for this card")
    ranking: Ranking = Field(default_factory=Ranking, description="its place among the alternatives the planner "
                                                                  "weighed, and why it was chosen")
    station_hash: str | None = Field(None, description="the frozen station its run measured (resolves at "
                                                       "/stations/<hash>); null until its run prepared it")
    parent_station_hash: str | None = Field(None, description="the frozen station of its parent (resolves at "
                                                              "/stations/<hash>); null while the parent was never run")
    asked_why: str | None = Field(None, description="why the loop asked a person about this card (its latest ask in "
                                                    "the decision log: the authorisation table's entries, e.g. "
                                                    "'quality_risk -> ask', or the budget it would cross); null when "
                                                    "it never asked")
    parent_measured: str | None = Field(None, description="the parent's measured figures in the goal's own terms "
                                                          "(its objective, each limit at its statistic): what the "
                                                          "card's prediction is relative to; for cards awaiting a person")


class DecisionIn(_In):
    card_hash: str = Field(pattern=r"^[0-9a-f]{16}$", description="the hash of the card as it was shown")
    reason: Reason | None = None


class RejectIn(DecisionIn):
    reason: Reason = Field(description="why the card is rejected")


class ApprovalOut(BaseModel):
    candidate_id: int
    card_hash: str
    decision: Literal["approve", "reject"]
    who: str
    reason: str | None = None
    created_at: datetime


class InstructionIn(_In):
    kind: Literal["pause", "resume", "stop", "one_more_round", "restore"]
    count: int | None = Field(None, ge=1, le=100)
    knobs: dict[str, Any] = Field(default_factory=dict)
    restore: str | None = Field(None, max_length=64)
    text: str | None = Field(None, max_length=500)


class InstructionOut(snapshots.Instruction):
    """An instruction as the store keeps it (state/snapshots.py: one field list for both); on the answer to a new
    one, `note` tells the person at once what it replaced and whether it waits for a person's decision."""

    note: str | None = None
    # the outcome's kind and the instruction that replaced it are the code's to branch on; the answer shows the
    # outcome's words, as it always did
    outcome_kind: snapshots.OutcomeKind | None = Field(None, exclude=True)
    superseded_by: int | None = Field(None, exclude=True)


class DecisionOut(BaseModel):
    id: int
    kind: str
    candidate_id: int | None = None
    run_id: str | None = None
    station_hash: str | None = None
    changed: bool
    text: str
    data: dict[str, Any] = {}
    created_at: datetime
    who: str | None = Field(None, description="the person behind it: who rejected, who asked for a restore, who "
                                              "approved the card it is about; null for the loop's own")
    via: str | None = Field(None, description="where that person said it: api | dashboard | chat | slack | feishu | "
                                              "cli; null where the record does not say")


class DriftFigureOut(BaseModel):
    """One of the goal's figures of a run predicted by the calibrated simulator beside its measurement."""

    key: str
    words: str
    predicted: float | None
    measured: float | None
    drift: float | None = Field(None, description="predicted / measured - 1")
    limit_ms: float | None = None


class ExperimentOut(BaseModel):
    id: str
    goal_id: str | None
    candidate_id: int | None
    stage: str
    n: int
    target: str
    status: str
    status_reason: str | None = None
    station_hash: str | None = None
    card: dict[str, Any] | None = None
    verdict: str | None = None
    verdict_reasons: list[str] = []
    figures: str = ""
    summary: dict[str, Any] | None = None
    run_dir: str | None = Field(None, description="the experiment's directory under the service's runs root, once "
                                                  "it ran (`tuneloop load export` and `load summarize` take it)")
    drift: Drift | None = Field(None, description="a real run of a target with a calibrated profile: the "
                                                  "simulator's prediction of its station beside the measured "
                                                  "output tok/s and mean TPOT, and whether it drifted")
    drift_figures: list[DriftFigureOut] = Field(
        default_factory=list, description="with `drift`: the goal's own figures (its objective, then each limit at its "
                                          "statistic and each reported figure) predicted beside measured")


class PhaseOut(BaseModel):
    phase: str
    event: str
    status: str
    epoch: int
    target: str
    detail: dict[str, Any] | None = None
    error_class: str | None = None
    at: datetime | None = None


class StationOut(snapshots.Station):
    """A frozen station as the store keeps it (state/snapshots.py: one field list for both)."""


class BestOut(StationOut):
    """The deployable best station with the figures that made it best (the run that measured it)."""

    decision: str = Field(description="the decision that made it best: baseline | new_best | quality_passed")
    run_id: str | None = None
    n: int | None = Field(None, description="the measured N (results of different N are never compared)")
    objective_metric: str
    objective_window: Literal["native", "whole"]
    objective: float | None = Field(None, description="the objective figure in its window; null when that window "
                                                      "had no valid figure (never 0)")
    whole: float | None = Field(None, description="the objective's figure in the whole window")
    native: float | None = Field(None, description="the objective's figure in the native window")
    objective_words: str = Field("", description="the objective as a person reads it: 'goodput (req/s, whole window)'")
    slo: str = Field("", description="the goal's own SLO in words: 'TTFT p99 < 2000 ms, TPOT p99 < 35 ms'")
    figures: list["FigureOut"] = Field(default_factory=list, description="each limit at its own statistic, then each "
                                       "figure the goal reports (core.goalview GoalView.columns)")


class FigureOut(BaseModel):
    """One figure of a run as the goal view names it: a limit's (with the limit) or one the goal reports."""

    key: str
    words: str
    value: float | None
    limit_ms: float | None = None


class FrontierAxis(BaseModel):
    """One frontier plot of the goal (core/goalview.py `axes`): the objective against this latency."""

    key: str
    words: str
    limit_ms: float | None = None
    binding: bool = Field(description="the limit binding at the best run (the first plot, the report's answer's)")
    png: str = Field(description="the plot's route")


class FrontierPoint(BaseModel):
    decision: str
    run_id: str | None
    station_hash: str | None
    n: int | None
    whole: float | None = Field(description="the objective's figure in the whole window")
    native: float | None = Field(description="the objective's figure in the native window")
    figures: list[FigureOut] = Field(default_factory=list, description="the goal view's figures of this run")
    text: str


class BudgetOut(BaseModel):
    card_hours_limit: float
    card_hours_used: float
    card_hours_left: float
    experiments_limit: int
    experiments_used: int
    experiments_left: int
    deadline: datetime | None = None
    deadline_passed: bool


class ChatIn(_In):
    text: str = Field(min_length=1, max_length=2000)


class ChatOut(BaseModel):
    intent: dict[str, Any]
    reply: str
    action: dict[str, Any] | None = None
    who: str
    via: Literal["parser", "llm"] = Field("parser", description="who mapped the text onto the intent")


GoalOut.model_rebuild()
BestOut.model_rebuild()

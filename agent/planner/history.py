"""What the planner knows: finished experiments, negatives with their conditions, the best station, budget.

Built by the loop from the store (the record of truth) before every planning step; the planner takes a
History and returns the next card or None (ask/tell). Everything here is plain frozen data.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr

from agent.planner.cards import CandidateCard, station_hash
from agent.planner.costs import CostModel
from agent.planner.refusals import Refusal, RefusalKind
from agent.planner.twin_fit import Fitter
from core.canonical import canon
from core.knobs import catalog
from core.evidence import Evidence
from core.goalview import PlannerGoal
from core.summary import Summary

if TYPE_CHECKING:  # annotations only
    from agent.planner.diagnosed import Diagnosis

Decision = Literal[
    "reference",  # a baseline measurement of a station
    "negative",  # valid, and worse (or broke the SLO): never repeated under the same conditions
    "promising",  # screen passed: confirm next
    "window_pending",  # confirmed better, but without the objective's window: recover it before it can be the best
    "new_best",  # confirmed and better: the new deployable best station
    "tradeoff",  # confirmed, loses on the objective but wins on latency: kept on the frontier
    "quality_pending",  # confirmed and better, but a quality-risk change not yet evaluated
    "quality_failed",  # faster, but its quality evaluation failed: never deployable
    "fault",  # orchestration or collection fault: not a result, never a negative
    "invalid",  # contract violation: not a result, never a negative
]


class Figures(BaseModel):
    """The figures one valid run is compared by; a missing window is None, never 0."""

    model_config = ConfigDict(frozen=True)
    n: int
    whole: float | None = None  # objective metric in the whole window
    native: float | None = None  # objective metric in the native window (None if the window was invalid)
    whole_s: float | None = None
    native_s: float | None = None
    native_n: int | None = None
    ttft_mean: float | None = None
    ttft_p90: float | None = None
    tpot_mean: float | None = None
    e2e_mean: float | None = None
    slo_violations: list[str] = Field(default_factory=list)

    @classmethod
    def of(cls, s: Summary, metric: str, violations: list[str]) -> "Figures":
        return cls(n=s.n_formal, whole=getattr(s.whole, metric) if s.whole else None,
                   native=getattr(s.native, metric) if s.native else None,
                   whole_s=s.whole.duration if s.whole else None, native_s=s.native.duration if s.native else None,
                   native_n=s.native.n_requests if s.native else None, ttft_mean=s.ttft_ms.mean,
                   ttft_p90=s.ttft_ms.p90, tpot_mean=s.tpot_ms.mean, e2e_mean=s.e2e_ms.mean,
                   slo_violations=list(violations))


class Outcome(BaseModel):
    model_config = ConfigDict(frozen=True)
    card: CandidateCard
    verdict: str
    decision: Decision
    figures: Figures | None = None
    reason: str = ""
    card_hours: float = 0.0
    run_id: str | None = None
    summary: Summary | None = None
    evidence: Evidence = Field(default_factory=Evidence)
    costs: list[Any] = Field(default_factory=list)


# the parent's knobs digest (a card's parent_knobs_hash), not a frozen station hash; its former name is accepted
PARENT = AliasChoices("parent_knobs_hash", "parent_station")


class Negative(BaseModel):
    """A valid negative with the conditions it was found under."""

    model_config = ConfigDict(frozen=True)
    knob: str
    value: Any
    scenario: str
    data_version: str
    parent_knobs_hash: str = Field(validation_alias=PARENT)
    source_identity: str
    experiment_key: str
    reason: str = ""

    def applies(self, knob: str, value: Any, scenario: str, data_version: str, parent_knobs_hash: str,
                source_identity: str) -> bool:
        return (self.knob, self.value, self.scenario, self.data_version, self.parent_knobs_hash,
                self.source_identity) == (knob, value, scenario, data_version, parent_knobs_hash, source_identity)


class Veto(BaseModel):
    """A change a person rejected (or the authorisation table denied) from one parent station: a decision, not
    a measurement. It rules out nothing about the system; it is only never proposed again under the same
    conditions (scenario, parent station, data version, source identity), at any stage."""

    model_config = ConfigDict(frozen=True)
    knob: str | None  # None: the reference run of the parent station itself
    value: Any = None
    scenario: str
    data_version: str
    parent_knobs_hash: str = Field(validation_alias=PARENT)
    source_identity: str
    source: str = "person"  # person | authorisation
    who: str = ""
    reason: str = ""
    candidate_id: int | None = None
    also_knob: str | None = None  # a rejected coupled pair's second change: the veto is of that pair only
    also_value: Any = None
    more: tuple[tuple[str, Any], ...] = ()  # a rejected jump's further changes (knob, value): the veto is of that jump

    def applies(self, card: CandidateCard, data_version: str, source_identity: str) -> bool:
        """A veto of a change holds for a coupled pair (or a jump) that makes it too; a veto of a pair or a jump
        holds for cards that make all of its changes only (a person who refused them together said nothing of
        either alone)."""
        moves = [(c.knob, canon(c.new)) for c in card.changes] or [(None, canon(None))]
        vetoed = [(self.knob, canon(self.value))] + ([(self.also_knob, canon(self.also_value))]
                                                     if self.also_knob is not None else []) \
            + [(k, canon(v)) for k, v in self.more]
        return (all(m in moves for m in vetoed)
                and self.scenario == card.scenario
                and self.parent_knobs_hash == card.parent_knobs_hash and self.data_version == data_version
                and self.source_identity == source_identity)

    def refusal(self) -> Refusal:
        return Refusal(RefusalKind.REJECTED, f"candidate {self.candidate_id} was {self.how()}")

    def how(self) -> str:
        """How the card was ruled out, and by whom (the refusal's words after the candidate)."""
        what = "rejected by" if self.source == "person" else "denied by the authorisation table, as decided by"
        return f"{what} {self.who} under the same conditions" + (f" ({self.reason})" if self.reason else "")


class QualityFailure(BaseModel):
    """A station whose accuracy evaluation failed, by the quality-risk settings it had (each quality-risk knob it set
    away from the knob's default). Accuracy is the model's outputs, not the station's speed: any station that makes
    every one of these settings alters the outputs at least as much, so it is never deployable either and is not
    proposed, screened or searched again (a data version or source identity of its own is not asked: the model is
    the same)."""

    model_config = ConfigDict(frozen=True)
    settings: tuple[tuple[str, Any], ...]  # (knob, value), sorted by knob
    run_id: str | None = None

    @staticmethod
    def risky(knobs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
        """The quality-risk settings of a station: each quality-risk knob it sets away from its default."""
        return tuple(sorted((k.name, canon(knobs[k.name])) for k in catalog().knobs
                            if k.quality_risk and k.name in knobs and canon(knobs[k.name]) != canon(k.default)))

    def covers(self, knobs: dict[str, Any]) -> bool:
        """This station makes every one of the failed settings."""
        return bool(self.settings) and all(k in knobs and canon(knobs[k]) == v for k, v in self.settings)

    def refusal(self) -> Refusal:
        what = " + ".join(f"{k}={v!r}" for k, v in self.settings)
        return Refusal(RefusalKind.QUALITY_FAILED, f"{what} failed its quality evaluation"
                       + (f" (run {self.run_id})" if self.run_id else "") + ": never deployable")


class History(BaseModel):
    """What the planner knows, built once per loop iteration (agent/loop/nodes.py); the diagnosis of it is computed
    once too and kept with it (`diagnosis_for`), so the diagnose node and the planner read the same one."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    _diagnosis: Diagnosis | None = PrivateAttr(default=None)
    _diagnosed: bool = PrivateAttr(default=False)
    # the goal's twin fitter (agent/planner/twin.py: run ids -> a fit, or why not), handed over by the loop; a copy
    # keeps it (it is the same deployment's)
    _twin: Fitter | None = PrivateAttr(default=None)

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> "History":
        """A copy is another history: its diagnosis is computed afresh (pydantic would copy the cached one)."""
        out = super().model_copy(update=update, deep=deep)
        out._diagnosis, out._diagnosed = None, False
        out._twin = self._twin
        return out

    @property
    def twin(self) -> Fitter | None:
        """The goal's twin fitter (None: no twin for this goal)."""
        return self._twin

    def with_twin(self, fitter: Fitter | None) -> "History":
        """This history, with the goal's twin fitter set (the loop's, once per iteration)."""
        self._twin = fitter
        return self
    goal_id: str
    goal: PlannerGoal  # the goal as the planner reads it (state.goal.GoalSpec, frozen)
    data_version: str
    source_identity: str = "sim"
    best_knobs: dict[str, Any]
    warm_knobs: dict[str, Any] | None = None  # the station the service is running now
    outcomes: list[Outcome] = Field(default_factory=list)
    negatives: list[Negative] = Field(default_factory=list)
    vetoes: list[Veto] = Field(default_factory=list)
    budget_left_card_hours: float
    experiments_left: int
    cost: CostModel = CostModel()
    planner_notes: list[str] = Field(default_factory=list)
    # experiment key -> why the calibrated simulator set it aside unrun (agent/planner/prescreen.py): never a negative
    predicted_negatives: dict[str, str] = Field(default_factory=dict)
    quality_failures: list[QualityFailure] = Field(default_factory=list)  # failed accuracy evaluations

    @property
    def best_knobs_hash(self) -> str:
        """The digest of the best station's knobs (as cards' knobs_hash); the frozen hash is the store's."""
        return station_hash(self.best_knobs)

    def quality_failed(self, knobs: dict[str, Any]) -> QualityFailure | None:
        """The failed accuracy evaluation whose quality-risk settings this station makes too, if any."""
        return next((f for f in self.quality_failures if f.covers(knobs)), None)

    def vetoed(self, card: CandidateCard) -> Veto | None:
        """The veto that rules this card out under the current conditions, if any."""
        return next((v for v in self.vetoes if v.applies(card, self.data_version, self.source_identity)), None)

    @property
    def finished_keys(self) -> set[str]:
        """Experiments that gave a result (valid or a contract violation); a tooling fault is not one."""
        return {o.card.experiment_key for o in self.outcomes if o.decision != "fault"}

    def faulted(self, experiment_key: str) -> int:
        """How many attempts of this experiment ended in a tooling fault (each is retried as a new run)."""
        return sum(o.decision == "fault" and o.card.experiment_key == experiment_key for o in self.outcomes)

    def reference(self, knobs: dict[str, Any], n: int) -> Outcome | None:
        """The latest valid measurement of exactly this station at exactly this N."""
        h = station_hash(knobs)
        for o in reversed(self.outcomes):
            if o.verdict == "valid" and o.figures is not None and o.card.knobs_hash == h and o.card.n == n:
                return o
        return None

    def best_at_confirm_only(self) -> bool:
        """The best station was measured at the confirm N and not at the (different) screen N: its comparison is at
        confirm N, and a screen of a move from it needs a screen-N reference first."""
        proto = self.goal.protocol
        return proto.confirm_n != proto.screen_n and self.reference(self.best_knobs, proto.screen_n) is None \
            and self.reference(self.best_knobs, proto.confirm_n) is not None

    def latest_valid(self, knobs: dict[str, Any]) -> Outcome | None:
        h = station_hash(knobs)
        best = None
        for o in self.outcomes:
            if o.verdict == "valid" and o.card.knobs_hash == h and o.summary is not None:
                if best is None or o.card.n >= best.card.n:
                    best = o
        return best

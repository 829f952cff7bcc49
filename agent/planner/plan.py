"""The planner's answer (`Plan`: the next card or None, with the diagnosis, the ranking and the stop reason) and the
one interface every planner answers through (`Planner`: ask/tell, as optuna's samplers): the loop holds a
`Planner`, never a concrete class."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from agent.planner.candidates import CandidateCard
from agent.planner.diagnosis import Diagnosis
from agent.planner.history import History
from agent.planner.refusals import Refusal, RefusalKind, said
from core.ledger import Prediction


class PlanRow(BaseModel):
    """One move the planner weighed: its title, its value, and why (its refusals' lines when it was refused).
    Recorded (and shown) as the list [title, value, why]."""

    model_config = ConfigDict(frozen=True)
    title: str
    value: float
    why: str
    refusals: tuple[Refusal, ...] = ()

    @classmethod
    def of(cls, title: str, value: float, why: str, refusals: list[Refusal] | tuple[Refusal, ...] = ()) -> "PlanRow":
        """A weighed move: refused (its refusals' lines are its why) or passing (its own why)."""
        return cls(title=title, value=value, why=said(refusals) or why, refusals=tuple(refusals))

    def refused(self, *kinds: RefusalKind) -> bool:
        """One of its refusals is of one of these kinds."""
        return any(r.kind in kinds for r in self.refusals)

    def record(self) -> list[str | float]:
        """The row as the record keeps it (a card's `ranked`): [title, value, why]."""
        return [self.title, self.value, self.why]


class StopKind(str, Enum):
    """Why nothing passed the checks, as the planner's stop branches on it."""

    BUDGET_SPENT = "budget spent"  # the budget is what refused the candidates left
    ALL_REJECTED = "all rejected"  # a person (or the authorisation table) refused what was left
    NO_CANDIDATE = "no candidate"  # the checks refused them, for the reasons counted


@dataclass(frozen=True)
class Stop:
    """A stop's kind and its words (what is recorded)."""

    kind: StopKind
    words: str

    def __str__(self) -> str:
        return self.words


class SetAside(BaseModel):
    """A screen the pre-screen set aside unrun (predicted negative by the calibrated simulator): the loop records
    it (agent/loop/record.py record_set_asides) as a cancelled card and a note, never as a negative."""

    model_config = ConfigDict(frozen=True)
    card: CandidateCard
    prediction: Prediction
    why: str


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True)
    card: CandidateCard | None
    diagnosis: Diagnosis | None = None
    ranked: list[PlanRow] = []  # the moves weighed, for the record
    stop_reason: str | None = None
    fallback: str | None = None  # why the LLM's proposal was not used (the deterministic one was)
    llm_hypotheses: list[dict] | None = None
    move: bool = False  # the card is a chosen move (a rule's or the explorer's), not protocol (reference, confirm)
    set_aside: tuple[SetAside, ...] = ()  # screens predicted negative while planning, for the loop to record
    notes: tuple[str, ...] = ()  # what the planner could not do while planning (a pre-screen not possible), for the loop


class Planner(Protocol):
    """History in, the next card (or None: stop) out. `name` is what the record calls it."""

    name: str

    def ask(self, history: History) -> Plan: ...

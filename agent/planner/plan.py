"""The planner's answer (`Plan`: the next card or None, with the diagnosis, the ranking and the stop reason) and the
one interface every planner answers through (`Planner`: ask/tell, as optuna's samplers): the loop holds a
`Planner`, never a concrete class."""
from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict

from agent.planner.candidates import CandidateCard
from agent.planner.diagnosis import Diagnosis
from agent.planner.history import History
from core.ledger import Prediction


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
    ranked: list[tuple[str, float, str]] = []  # (title, value, why or refusal) for the record
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

"""The planner's answer: the next card or None, with the diagnosis, the ranking and the stop reason."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from agent.planner.candidates import CandidateCard
from agent.planner.diagnosis import Diagnosis


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True)
    card: CandidateCard | None
    diagnosis: Diagnosis | None = None
    ranked: list[tuple[str, float, str]] = []  # (title, value, why or refusal) for the record
    stop_reason: str | None = None
    fallback: str | None = None  # why the LLM's proposal was not used (the deterministic one was)
    llm_hypotheses: list[dict] | None = None
    move: bool = False  # the card is a chosen move (a rule's or the explorer's), not protocol (reference, confirm)

"""The hypothesis ledger of one goal, read from the store: each run card's prediction (stored with the card) and
the effect its run observed (stored with the run's decision), scored by core.ledger."""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from core.ledger import Observation, Prediction, Scored, score


def card_title(card: dict[str, Any]) -> str:
    ch = card.get("change")
    head = f"{card.get('stage', '?')} N={card.get('n', '?')}"
    return f"{head}: {ch.get('knob')} {ch.get('old')!r} -> {ch.get('new')!r}" if ch else f"{head}: the parent station"


def hypothesis_ledger(store: Any, goal_id: str) -> list[Scored]:
    """One row per judged run whose card carries a prediction, in decision order."""
    cards = {c.id: c.card for c in store.candidates(goal_id)}
    out: list[Scored] = []
    for d in store.decisions(goal_id):
        data = d.data or {}
        card = cards.get(d.candidate_id) if d.candidate_id is not None else None
        if "outcome" not in data or not card or not card.get("prediction"):
            continue
        try:
            pred = Prediction.model_validate(card["prediction"])
            obs = Observation.model_validate(data["observed"]) if data.get("observed") else None
        except ValidationError:  # a row written by another version: left out of the ledger, never guessed
            continue
        out.append(score(d.candidate_id, d.run_id, card_title(card), pred, obs))
    return out

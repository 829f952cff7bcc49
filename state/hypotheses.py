"""The hypothesis ledger of one goal, read from the store: each run card's prediction (stored with the card) and
the effect its run observed (stored with the run's decision), scored by core.ledger."""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from core.ledger import Observation, Prediction, Scored, score


def card_title(card: dict[str, Any]) -> str:
    """`confirm N=640: k 1 -> 2 + j 3 -> 4`: every change of a pair or a twin's jump named, not its first alone."""
    chs = [c for c in (card.get("change"), card.get("also"), *(card.get("more") or ())) if c]
    head = f"{card.get('stage', '?')} N={card.get('n', '?')}"
    words = " + ".join(f"{c.get('knob')} {c.get('old')!r} -> {c.get('new')!r}" for c in chs)
    return f"{head}: {words}" if chs else f"{head}: the parent station"


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

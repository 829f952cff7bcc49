"""Whether a screen can see a change at all, and the re-staging of a move straight to its confirm.

A screen runs N requests. A closed-loop client never holds more than N of them in flight, so a change of the
concurrency cap or of the decode batch limit that leaves both the in-flight load and the decode batch the same
at that N deploys, for the screen, exactly the parent's load: the screen could only repeat the reference and
record a negative the confirm N would not. Such a move goes straight to confirm N, where the comparison can see
it (docs/protocol.md § 2).
"""
from __future__ import annotations

from typing import Any

from agent.candidates import CandidateCard, with_stage
from agent.checks import estimate
from agent.history import History
from agent.rules.base import num

LOAD_KNOBS = ("concurrency", "max_num_seqs")


def _load_at(knobs: dict[str, Any], n: int, instances: float) -> tuple[float, float] | None:
    """(requests in flight, decode batch per instance) a run of n requests can reach at these knobs."""
    c, seqs = knobs.get("concurrency"), knobs.get("max_num_seqs")
    if not isinstance(c, (int, float)) or not isinstance(seqs, (int, float)):
        return None
    flight = float(min(c, n))
    return flight, float(min(seqs, flight / instances))


def screen_blind(card: CandidateCard, history: History) -> str | None:
    """Why this screen cannot see its change (None: it can): every change is a load knob and, at the screen's
    N, parent and card reach the same in-flight load and decode batch. Only when the parent has a run at the
    confirm N to compare a confirm with."""
    goal = history.goal
    if card.stage != "screen" or goal.protocol.confirm_n == card.n or not card.changes:
        return None
    if any(c.knob not in LOAD_KNOBS for c in card.changes):
        return None
    if history.reference(card.parent_knobs, goal.protocol.confirm_n) is None:
        return None
    ref = history.latest_valid(card.parent_knobs)
    inst = num(ref.evidence or {}, "decode_instances") if ref is not None else None
    inst = inst or float(card.parent_knobs.get("num_decode_instances") or 1)
    before, after = _load_at(card.parent_knobs, card.n, inst), _load_at(card.knobs, card.n, inst)
    if before is None or before != after:
        return None
    return (f"a screen of N={card.n} holds at most {before[0]:.0f} request(s) in flight and a decode batch of "
            f"{before[1]:.0f} per instance either way: it could only repeat the reference")


def to_confirm(card: CandidateCard, history: History, why: str) -> CandidateCard:
    """The screen card re-staged as its confirm (the same change at confirm N), saying why."""
    conf = with_stage(card, "confirm", history.goal.protocol.confirm_n)
    return conf.model_copy(update={"score": card.score, "est_card_hours": round(estimate(conf, history), 4),
                                   "note": "; ".join(x for x in (card.note, f"straight to confirm N={conf.n}: {why}") if x)})

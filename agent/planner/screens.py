"""Whether a screen can see a change at all, and the re-staging of a move straight to its confirm.

A screen runs N requests. A closed-loop client never holds more than N of them in flight, so a change of the
concurrency cap or of the decode batch limit that leaves both the in-flight load and the decode batch the same
at that N deploys, for the screen, exactly the parent's load: the screen could only repeat the reference and
record a negative the confirm N would not. Where the screen deploys only part of the change the confirm would
(C above N is cut to N), the expected effect shrinks with it; below the screen's noise the screen decides nothing
either. Such a move goes straight to confirm N, where the comparison can see it (docs/protocol.md § 2).
"""
from __future__ import annotations

from typing import Any

from agent.planner.candidates import CandidateCard, with_stage
from agent.planner.cards import CARD_HOURS_DIGITS
from agent.planner.checks import estimate
from agent.planner.history import History
from agent.planner.judgement import CLEAR_LOSS
from core.knobs import BATCH_CAP, CLIENT_CAP, DECODE_INSTANCES, by_role, role_of

LOAD_KNOBS = (CLIENT_CAP, BATCH_CAP)  # the roles of the load knobs a screen's N may hide


def _load_at(knobs: dict[str, Any], n: int, instances: float) -> tuple[float, float] | None:
    """(requests in flight, decode batch per instance) a run of n requests can reach at these knobs."""
    c, seqs = by_role(knobs, CLIENT_CAP), by_role(knobs, BATCH_CAP)
    if not isinstance(c, (int, float)) or not isinstance(seqs, (int, float)):
        return None
    flight = float(min(c, n))
    return flight, float(min(seqs, flight / instances))


def _seen(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The relative change of the decode batch per instance (what moves TPOT and tokens per step) from `before`
    to `after`; the in-flight load where the batch stays (a queue in front of the cap)."""
    (f0, b0), (f1, b1) = before, after
    if b0 > 0 and b1 != b0:
        return abs(b1 / b0 - 1.0)
    return abs(f1 / f0 - 1.0) if f0 > 0 else 0.0


def screen_blind(card: CandidateCard, history: History, gain: float | None = None) -> str | None:
    """Why this screen cannot resolve its change (None: it can). Every change is a load knob, the parent has a
    run at the confirm N to compare a confirm with, and either, at the screen's N, parent and card reach the same
    in-flight load and decode batch (the screen could only repeat the reference), or the screen deploys only
    part of the load change the confirm would and the expected effect (`gain`, scaled by that part) is below the
    screen's noise (the judgement's clear-loss band, or min_gain_pct when larger)."""
    goal = history.goal
    if card.stage != "screen" or goal.protocol.confirm_n == card.n or not card.changes:
        return None
    if any(role_of(c.knob) not in LOAD_KNOBS for c in card.changes):
        return None
    if history.reference(card.parent_knobs, goal.protocol.confirm_n) is None:
        return None
    ref = history.latest_valid(card.parent_knobs)
    inst = ref.evidence.decode_instances if ref is not None else None
    inst = inst or float(by_role(card.parent_knobs, DECODE_INSTANCES) or 1)
    before, after = _load_at(card.parent_knobs, card.n, inst), _load_at(card.knobs, card.n, inst)
    if before is None or after is None:
        return None
    if before == after:
        return (f"a screen of N={card.n} holds at most {before[0]:.0f} request(s) in flight and a decode batch of "
                f"{before[1]:.0f} per instance either way: it could only repeat the reference")
    full = (_load_at(card.parent_knobs, goal.protocol.confirm_n, inst), _load_at(card.knobs, goal.protocol.confirm_n, inst))
    if gain is None or full[0] is None or full[1] is None:
        return None
    whole = _seen(full[0], full[1])
    part = _seen(before, after) / whole if whole > 0 else 1.0
    noise = max(CLEAR_LOSS, goal.stop.min_gain_pct / 100.0)
    if part >= 1.0 or gain * part >= noise:
        return None
    return (f"a screen of N={card.n} deploys {part:.0%} of the load change the confirm N={goal.protocol.confirm_n} "
            f"would (decode batch {before[1]:.0f} -> {after[1]:.0f} per instance): the expected {gain:.0%} shows as "
            f"{gain * part:.1%}, inside the screen's {noise:.0%} noise")


def load_unchanged(card: CandidateCard, n: int) -> str | None:
    """Why this card's change deploys its parent's load at N = n as well (None: it changes it): every change is a
    load knob and both reach the same in-flight load and decode batch cap (a batch limit at or above C, counted on
    one instance, never binds). A move that changes nothing at the confirm N cannot change a decision."""
    if not card.changes or any(role_of(c.knob) not in LOAD_KNOBS for c in card.changes):
        return None
    before, after = _load_at(card.parent_knobs, n, 1.0), _load_at(card.knobs, n, 1.0)
    if before is None or before != after:
        return None
    return (f"at N={n} both hold {before[0]:.0f} request(s) in flight and a decode batch cap of {before[1]:.0f}: "
            f"the change deploys the same load")


def to_confirm(card: CandidateCard, history: History, why: str) -> CandidateCard:
    """The screen card re-staged as its confirm (the same change at confirm N), saying why."""
    conf = with_stage(card, "confirm", history.goal.protocol.confirm_n)
    # a model's prediction of the station holds at either stage (the twin's is at the confirm N); the value model's
    # is made afresh for the confirm (it reads the screen)
    own = card.prediction if card.prediction is not None and card.prediction.source != "value_model" else None
    return conf.model_copy(update={"score": card.score, "prediction": own,
                                   "est_card_hours": round(estimate(conf, history), CARD_HOURS_DIGITS),
                                   "note": "; ".join(x for x in (card.note, f"straight to confirm N={conf.n}: {why}") if x)})

"""The value model's numeric prediction for a card (core.ledger.Prediction) and the effect its run observed.

The value model says "gain g if hypothesis h holds, with likelihood p": its point prediction on the objective
is the expected effect g·p, inside [-noise, 1.5·g] (the hypothesis may be wrong: nothing changes, or a clear
loss; or it holds and the gain is larger than the rule's typical figure). A trade-off move predicts a small
loss. On the binding SLO (the latency limit with the least headroom at the parent) the move's known direction
gives the interval: more in flight raises TPOT, speculation lowers it. A confirm predicts what its screen
measured. A card that already carries a prediction (an explorer's, the calibrated simulator's) keeps it.
"""
from __future__ import annotations

from typing import Any

from agent.planner.candidates import CandidateCard, direction_of, rule_for
from agent.planner.checks import estimate
from agent.planner.history import Figures, History, Outcome
from agent.planner.judgement import CLEAR_LOSS
from agent.planner.deterministic import diagnosis_for
from agent.planner.value import value_of
from core.knobs import (
    ARRIVAL_RATE, BATCH_CAP, CLIENT_CAP, DECODE_INSTANCES, DRAFT_METHOD, DRAFT_WIDTH, EXPERT_PLACEMENT, INDEX_REUSE,
    KV_MEMORY_FRACTION, PREFILL_INSTANCES, PREFILL_REQUEST_CAP, PREFILL_TOKEN_BUDGET, role_of,
)
from core.limits import figure_of
from core.ledger import Interval, Observation, Prediction, relative
from core.summary import Summary

# the binding SLO figure's direction per move (by the knob's role): (low, high) as multiples of the objective gain
LOAD_UP = {BATCH_CAP, CLIENT_CAP, ARRIVAL_RATE, KV_MEMORY_FRACTION, PREFILL_REQUEST_CAP, PREFILL_TOKEN_BUDGET,
           PREFILL_INSTANCES}
LATENCY_DOWN = {DRAFT_METHOD, DRAFT_WIDTH, INDEX_REUSE, DECODE_INSTANCES, EXPERT_PLACEMENT}
SCREEN_SPREAD = 0.03  # a confirm's interval around what its screen measured: at least ± 3 % (a judgement)
SCREEN_SPREAD_SHARE = 0.3  # ... or ± 30 % of that measured effect where wider (a judgement)
UPSIDE = 1.5  # the interval reaches 1.5 × the rule's gain: it may beat the rule's typical figure (judgement)
TRADEOFF_DOWNSIDE = 5  # a trade-off move's objective and latency effects reach down to −5 × its gain (a judgement)
LOAD_LATENCY_SHARE = 0.5  # a load raise's point prediction on the binding latency: half its objective's (judgement)


def binding_slo(history: History, parent: Outcome | None) -> str | None:
    """The key of the latency limit with the least slack at the parent's reference (core/goalview.py; the first one
    when unmeasured)."""
    got = history.goal.view().binding(parent.summary if parent is not None else None)
    return None if got is None else got.key


def slo_figure(s: Summary | None, key: str) -> float | None:
    """The figure a latency limit's key constrains, read off a Summary (core/limits.py figure_of)."""
    return figure_of(s, key)


def objective_name(history: History) -> str:
    o = history.goal.objective
    return f"{o.metric} ({o.window})"


def predict(card: CandidateCard, history: History) -> CandidateCard:
    """The card with a prediction: its own if it has one, else the value model's."""
    if card.prediction is not None:
        own = card.prediction
        if own.slo_effect is None and card.change is not None:  # the explorer models the objective only
            vp = value_prediction(card, history)
            if vp.slo_effect is not None:
                own = own.model_copy(update={"slo": vp.slo, "slo_effect": vp.slo_effect,
                                             "basis": f"{own.basis}; on {vp.slo}: the value model's direction"})
        return card if own is card.prediction else card.model_copy(update={"prediction": own})
    return card.model_copy(update={"prediction": value_prediction(card, history)})


def value_prediction(card: CandidateCard, history: History) -> Prediction:
    parent = history.reference(card.parent_knobs, card.n) or history.latest_valid(card.parent_knobs)
    slo = binding_slo(history, parent)
    noise = Interval(value=0.0, lo=-CLEAR_LOSS, hi=CLEAR_LOSS)
    if card.change is None:
        return Prediction(source="value_model", objective=objective_name(history), objective_effect=noise, slo=slo,
                          slo_effect=noise if slo else None, basis="a reference: the same station again, run-to-run "
                                                                   "noise only")
    screen = _screen_of(card, history) if card.stage == "confirm" else None
    if screen is not None and screen[0] is not None:
        obj, lat = screen
        spread = max(SCREEN_SPREAD, abs(obj) * SCREEN_SPREAD_SHARE)
        return Prediction(source="value_model", objective=objective_name(history),
                          objective_effect=Interval(value=obj, lo=obj - spread, hi=obj + spread), slo=slo,
                          slo_effect=None if lat is None or not slo else
                          Interval(value=lat, lo=lat - max(SCREEN_SPREAD, abs(lat) * SCREEN_SPREAD_SHARE),
                                   hi=lat + max(SCREEN_SPREAD, abs(lat) * SCREEN_SPREAD_SHARE)),
                          basis="what the screen of this change measured (a longer run: the same effect, less ramp)")
    direction = direction_of(card.change)
    rule = rule_for(card.change.knob, direction)
    v = value_of(card, rule, diagnosis_for(history), estimate(card, history), history.budget_left_card_hours)
    g = v.gain
    if rule.tradeoff:
        obj = Interval(value=-g, lo=-TRADEOFF_DOWNSIDE * g - CLEAR_LOSS, hi=CLEAR_LOSS)
    else:
        point = g * v.confidence
        obj = Interval(value=point, lo=min(-CLEAR_LOSS, point), hi=max(UPSIDE * g, point))
    role = role_of(card.change.knob)
    if rule.tradeoff:
        lat = Interval(value=-g, lo=-TRADEOFF_DOWNSIDE * g - CLEAR_LOSS, hi=CLEAR_LOSS)
    elif role in LATENCY_DOWN and direction == "up":
        lat = Interval(value=-obj.value, lo=-UPSIDE * g - CLEAR_LOSS, hi=CLEAR_LOSS)
    elif role in LOAD_UP and direction == "up":
        lat = Interval(value=obj.value * LOAD_LATENCY_SHARE, lo=-CLEAR_LOSS, hi=UPSIDE * g + CLEAR_LOSS)
    else:
        lat = Interval(value=0.0, lo=-g - CLEAR_LOSS, hi=g + CLEAR_LOSS)
    return Prediction(source="value_model", objective=objective_name(history), objective_effect=obj, slo=slo,
                      slo_effect=lat if slo else None,
                      basis=f"gain {g:.2f} × confidence {v.confidence:.2f}" + (f" ({card.hypothesis})" if card.hypothesis else "")
                      + ("; a trade-off move" if rule.tradeoff else ""))


def _screen_of(card: CandidateCard, history: History) -> tuple[float | None, float | None] | None:
    """The observed effects of this change's screen (the same station at the screen N)."""
    for o in reversed(history.outcomes):
        if o.card.stage == "screen" and o.card.knobs_hash == card.knobs_hash and o.figures is not None:
            ob = observe(o.card, o.figures, o.summary, history)
            return ob.objective_effect, ob.slo_effect
    return None


def observe(card: CandidateCard, figures: Figures | None, summary: Summary | None, history: History) -> Observation:
    """The run's effect against the parent's (for a reference: the same station's earlier) run at the same N."""
    if figures is None:
        return Observation(note="no valid figures: nothing observed")
    ref = history.reference(card.parent_knobs, card.n)
    if ref is None or ref.figures is None:
        return Observation(note=f"no earlier valid run of the parent at N={card.n} to compare with")
    window = history.goal.objective.window
    used = window if getattr(figures, window) is not None and getattr(ref.figures, window) is not None else "whole"
    obj = relative(getattr(figures, used), getattr(ref.figures, used))
    pred: Any = card.prediction
    slo = pred.slo if pred is not None else binding_slo(history, ref)
    lat = relative(slo_figure(summary, slo), slo_figure(ref.summary, slo)) if slo else None
    return Observation(objective_effect=obj, slo_effect=lat, window=used if obj is not None else None,
                       against=ref.run_id)


def observed(card: CandidateCard, figures: Figures | None, summary: Summary | None, history: History) -> dict[str, Any]:
    """The decision data's `observed` entry."""
    return {"observed": observe(card, figures, summary, history).model_dump(mode="json")}

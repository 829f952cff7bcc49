"""Rough candidate value: likely gain × confidence, what a negative rules out, and what it costs.

Deliberately coarse (docs/protocol.md §4: "rough, not fake-precise"). Cost is estimated in card-hours from the
costs the executor reported for earlier runs (restart, weight load, warm-up, load), with conservative
defaults before the first run. A cost-class factor puts hot C/r changes before restarts when gains are
comparable; a relayout is worth nothing without imbalance evidence.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from agent.planner.cards import CandidateCard, direction_of
from agent.planner.costs import CostModel  # noqa: F401  (re-exported)
from agent.planner.diagnosis import OPEN_LOW, Diagnosis
from agent.planner.rules import RULES
from agent.planner.rules.base import MoveRule

CLASS_FACTOR = {"hot": 1.0, "restart": 0.85, "relayout": 0.6, "topology": 0.5,
                "rebuild": 0.4}  # a judgement: hot C/r changes before restarts when gains are comparable (protocol §4)
DEFAULT_CLASS_FACTOR = 0.4  # a cost class CLASS_FACTOR does not list counts as its dearest, a rebuild (judgement)
NO_HYPOTHESIS_CONFIDENCE = 0.3  # a move naming no hypothesis (a judgement; at OPEN_LOW, so its negative rules out)
NATIVE_MISSING_CONFIDENCE = 0.5  # a trade-off move while the native window is missing: at least this sure (judgement)
RULES_OUT_SHARE = 0.1  # what a negative that closes a hypothesis is worth: a tenth of its confidence (a judgement)
BUDGET_SHARE_DAMP = 0.5  # value falls with the share of the budget left a card spends: half at all of it (judgement)
VALUE_DIGITS = 6  # a card's value (its score) is kept to 1e-6
MIN_VALUE = 0.02  # the rules' least value: below it a move is not worth its cost (agent/planner/stops.py)
PREDICTED_DIGITS = 4  # a predicted figure (the hypothesis ledger's `predicted`) is kept to 1/10000 of its unit
INTERVAL_Z = 1.64  # a model's predicted interval: ± 1.64 σ, 90 % of a normal error (the explorer's, the twin's)


def per_card_hour(worth: float, cost_class: str, cost_card_hours: float, budget_left: float,
                  restart_card_hours: float | None = None) -> float:
    """A move's worth (its expected gain, in the objective's relative units) per card-hour, the one scale every move
    is ranked on: scaled by its cost class, by its cost against a restarting screen's (`restart_card_hours`: a hot
    screen on the warm service costs a fraction of one) and by its share of the budget left."""
    share = cost_card_hours / budget_left if budget_left > 0 else 1.0
    per_hour = restart_card_hours / (restart_card_hours + cost_card_hours) if restart_card_hours else 1.0
    return worth * CLASS_FACTOR.get(cost_class, DEFAULT_CLASS_FACTOR) * per_hour \
        * max(0.0, 1.0 - BUDGET_SHARE_DAMP * share)


class Value(BaseModel):
    model_config = ConfigDict(frozen=True)
    value: float
    gain: float
    confidence: float
    rules_out: float
    cost_card_hours: float
    why: str


def confidence(rule: MoveRule, diag: Diagnosis | None) -> tuple[float, str | None]:
    """The strongest linked hypothesis' likelihood (0.3 when the move names none)."""
    if not rule.hypotheses or diag is None:
        return NO_HYPOTHESIS_CONFIDENCE, None
    best = max(rule.hypotheses, key=diag.likelihood)
    return diag.likelihood(best), best


def value_of(card: CandidateCard, rule: MoveRule, diag: Diagnosis | None, cost_card_hours: float,
             budget_left: float, native_missing: bool = False, restart_card_hours: float | None = None,
             extra_gain: float = 0.0, min_confidence: float = 0.0) -> Value:
    """gain × confidence + what a negative rules out, per device-hour: scaled by cost class, by the card's cost
    against a restarting screen's (`restart_card_hours`: a hot screen on the warm service costs a fraction of
    one) and by its share of the budget left. `extra_gain`: a coupled pair's second change's gain;
    `min_confidence`: its floor (the coupling is read off the best station's own evidence)."""
    conf, hyp = confidence(rule, diag)
    conf0, gain = conf, rule.gain
    limit_note, answered = "", False
    if diag is not None and card.change is not None:
        up = direction_of(card.change) == "up"
        for r in RULES:  # each rule's value model reads its own evidence (cap vs budget, C vs r, acceptance, ...)
            adj = r.value(card.change, up, diag, conf, gain) if r.value is not None else None
            if adj is not None:
                conf, gain, limit_note, answered = adj.confidence, adj.gain, adj.note, answered or adj.answered
    gain += extra_gain  # a coupled pair's second lever (agent/planner/pairs.py), after the first one's value models
    conf = max(conf, min_confidence)  # a coupled pair: the coupling itself is measured evidence
    if diag is None and card.cost_class == "relayout":
        gain = 0.0  # relayout only when the evidence shows time lost to imbalance
    if rule.tradeoff and native_missing:
        # no valid steady state at this C: a lower C may give one, and lower latency (a frontier point)
        conf = max(conf, NATIVE_MISSING_CONFIDENCE)
    # A negative on a supported hypothesis separates explanations; on a weak one it tells little. A trade-off
    # move's negative closes no hypothesis (agent.planner.deterministic.closes_hypothesis): it may lose on the objective by
    # design, so only its gain counts, unless it may give the missing native window.
    closes = not rule.tradeoff or native_missing
    rules_out = RULES_OUT_SHARE * conf if conf >= OPEN_LOW and not answered and closes else 0.0
    v = per_card_hour(gain * conf + rules_out, card.cost_class, cost_card_hours, budget_left, restart_card_hours)
    why = (f"gain {gain:.2f} × confidence {conf0 if limit_note else conf:.2f}" + (f" ({hyp})" if hyp else "") + limit_note +
           f" + rules out {rules_out:.2f}; {card.cost_class}, ~{cost_card_hours:.2f} card-h of {budget_left:.2f} left")
    return Value(value=round(v, VALUE_DIGITS), gain=gain, confidence=conf, rules_out=rules_out,
                 cost_card_hours=cost_card_hours, why=why)

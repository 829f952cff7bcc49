"""Candidate cards worded from the move rules: `build_card` gives a change its mechanism, decision, expected
effect and what a negative rules out from the rule that owns the move (`rule_for`). The card as data
(CandidateCard, Change, the hashes) is agent/planner/cards.py, which imports no rule; its names are re-exported
here. Moves are generated from the discrete search space: the neighbouring value of each knob, up and down, each
tied to the hypothesis it tests.
"""
from __future__ import annotations

from typing import Any

from agent.planner.cards import (  # noqa: F401  (re-exported: the card's data model, read from here too)
    CandidateCard,
    card_of,
    card_record,
    Change,
    change_words,
    digest,
    direction_of,
    knobs_hash,
    neighbours,
    Stage,
    station_hash,
    with_stage,
)
from agent.planner.rules import MOVES as RULES  # the move table, built from the rules' own moves
from agent.planner.rules.base import MoveRule
from core.knobs import catalog, role_of


def rule_for(knob: str, direction: str) -> MoveRule:
    """The move a knob's change in one direction makes: the table is keyed by the knob's role, not its name."""
    role = role_of(knob)
    return (RULES.get((role, direction)) if role else None) or MoveRule()


def build_card(goal_id: str, scenario: str, parent: dict[str, Any], knob: str | None, new: Any, *,
               stage: Stage, n: int, direction: str = "up", planner: str = "deterministic",
               **over: Any) -> CandidateCard:
    """A card for one change (or a baseline of `parent` when knob is None), worded from the move rules."""
    if knob is None:
        fields: dict[str, Any] = dict(
            mechanism="measure the parent station in the same scenario and N, so the comparison is like for like",
            decision="the reference figure for comparisons at this N", expected_effect="none: a reference",
            negative_rules_out="nothing (a reference is never a negative)", cost_class="hot", hypothesis=None)
        fields.update(over)
        return CandidateCard(goal_id=goal_id, scenario=scenario, parent_knobs=dict(parent), change=None,
                             stage=stage, n=n, planner=planner, **fields)
    rule = rule_for(knob, direction)
    kdef = catalog().get(knob)
    fields = dict(mechanism=rule.mechanism, decision=rule.decision, expected_effect=rule.expected,
                  negative_rules_out=rule.rules_out, cost_class=kdef.cost_class, quality_risk=kdef.quality_risk,
                  hypothesis=rule.hypotheses[0] if rule.hypotheses else None)
    fields.update(over)
    return CandidateCard(goal_id=goal_id, scenario=scenario, parent_knobs=dict(parent),
                         change=Change(knob=knob, old=parent.get(knob, kdef.default), new=new),
                         stage=stage, n=n, planner=planner, **fields)

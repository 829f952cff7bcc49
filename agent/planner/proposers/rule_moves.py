"""The evidence rules' moves: every one-change move from the best station over the goal's space, valued by the
move table (agent/planner/rules/: the hypothesis a move tests, its gain if that holds) against the diagnosis;
the next value each way, and a jump where a rule's evidence sizes one (the one-step move stays, ranked after it)."""
from __future__ import annotations

from typing import Any

from agent.planner.candidates import build_card, neighbours, rule_for
from agent.planner.cards import CARD_HOURS_DIGITS
from agent.planner.checks import estimate, retry_note
from agent.planner.diagnosis import LOAD_HEADROOM, Diagnosis
from agent.planner.history import History
from agent.planner.pairs import SIZED_STEP_DISCOUNT
from agent.planner.proposers.base import Asking, Proposals, Proposed, Proposer
from agent.planner.recovery import LOAD_UP, batch_cap_available
from agent.planner.rules import RULES
from agent.planner.screens import load_unchanged
from agent.planner.tpot_fit import line_limit, load_chance
from agent.planner.value import VALUE_DIGITS, value_of
from core.knobs import BATCH_CAP, CLIENT_CAP, role_of

BATCH_UP = (BATCH_CAP, CLIENT_CAP)  # roles whose raise widens the decode batch


def sized_jumps(knob: str, cur: Any, values: list, history: History, diag: Diagnosis | None) -> dict[str, tuple]:
    """The jumps the rules' evidence sizes for one knob, by direction: (value, expected effect in words). Each
    rule sizes its own moves (agent/planner/rules/<hypothesis>.py `sized`); the first rule to size a direction wins."""
    out: dict[str, tuple] = {}
    for r in RULES:
        got = r.sized(knob, cur, values, history, diag) if r.sized is not None else None
        if got is not None and got[0] not in out:
            out[got[0]] = (got[1], got[2])
    return out


class RuleMoves(Proposer):
    name = "rules"
    phase = "rank"

    def propose(self, asking: Asking) -> Proposals:
        history, diag, restart = asking.history, asking.diag, asking.restart
        goal = history.goal
        out = []
        for knob, values in goal.space().items():
            cur = history.best_knobs.get(knob)
            moves = neighbours(knob, cur, list(values))
            jumps = sized_jumps(knob, cur, list(values), history, diag)
            moves = [(d, j[0]) for d, j in jumps.items()] + moves
            role = role_of(knob)
            for direction, new in moves:
                jump = jumps.get(direction)
                try:
                    over = {}
                    if jump is not None and new == jump[0]:
                        over["expected_effect"] = jump[1]
                    card = build_card(history.goal_id, goal.scenario, history.best_knobs, knob, new, stage="screen",
                                      n=goal.protocol.screen_n, direction=direction, **over)
                except Exception:  # a knob outside the catalog cannot become a card
                    continue
                if load_unchanged(card, goal.protocol.confirm_n):  # not even the confirm could see it
                    continue
                cost = estimate(card, history)
                v = value_of(card, rule_for(knob, direction), diag, cost, history.budget_left_card_hours,
                             asking.native_missing, restart_card_hours=restart)
                if role in LOAD_UP and direction == "up" and diag is not None and diag.headroom is not None \
                        and diag.headroom < LOAD_HEADROOM and batch_cap_available(history):
                    # the binding latency near its limit holds the load back; a gain that crosses the limit can still
                    # be kept by capping the decode batch (latency recovery), so a load move keeps a floor value
                    floor = value_of(card, rule_for(knob, direction).model_copy(update={"hypotheses": ()}), None,
                                     cost, history.budget_left_card_hours, asking.native_missing,
                                     restart_card_hours=restart)
                    if floor.value > v.value:
                        v = floor.model_copy(update={"why": floor.why + "; a decode batch cap can keep a gain that "
                                                                        "crosses the latency limit"})
                elif role in BATCH_UP and direction == "up" and diag is not None and diag.headroom is not None \
                        and 0 <= diag.headroom < LOAD_HEADROOM:
                    # near the limit, with no way back but the move itself: worth its gain only as often as the
                    # wider batch stays under the limit (agent/planner/tpot_fit.py load_chance)
                    got = load_chance(history, card.knobs, line_limit(history))
                    if got is not None and got[0] < 1.0:
                        v = v.model_copy(update={"value": round(v.value * got[0], VALUE_DIGITS),
                                                 "why": v.why + f"; × {got[0]:.2f}, its chance under the latency "
                                                                f"limit: {got[1]}"})
                if jump is not None and new != jump[0]:
                    v = v.model_copy(update={"value": round(v.value * SIZED_STEP_DISCOUNT, VALUE_DIGITS),
                                             "why": v.why + f"; the evidence sizes a jump to {jump[0]} instead"})
                out.append(Proposed(card.model_copy(update={"score": v.value,
                                                            "est_card_hours": round(cost, CARD_HOURS_DIGITS),
                                                            "note": retry_note(card, history)}), v))
        return Proposals(moves=out)

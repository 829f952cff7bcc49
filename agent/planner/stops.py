"""When the rules run out: the explorer's card, or a stop that names its reason with figures.

Stop rules for an unattended night: never stop while the best station breaks the SLO and the budget pays for a
run (the explorer, or any rule move that passes the checks, goes on toward feasibility); "K experiments in a
row changed nothing" stops only when the explorer's expected improvement is below the goal's `min_gain_pct`;
so does "nothing left is worth its cost". The budget and the rejections stop it plainly.
"""
from __future__ import annotations

from typing import Callable

from agent.planner.best import best_infeasible
from agent.planner.candidates import CandidateCard
from agent.planner.diagnosis import Diagnosis
from agent.planner.history import History
from agent.planner.plan import Plan, PlanRow, Stop, StopKind
from agent.planner.proposers import Asking, Exploring, Proposed, of_phase
from agent.planner.proposers.guarded import asked
from agent.planner.refusals import GONE, RefusalKind
from agent.planner.value import MIN_VALUE, Value

__all__ = ["MIN_VALUE", "explore_or_stop", "no_candidate_reason"]  # MIN_VALUE is value.py's, read here too


def explore_or_stop(history: History, diag: Diagnosis | None, ranked: list[PlanRow],
                    passing: list[tuple[CandidateCard, Value]], stale: bool,
                    restage: Callable[[CandidateCard], CandidateCard] | None = None) -> Plan:
    """The explorer's best card (re-staged by `restage` where a screen cannot serve), or the stop."""
    goal = history.goal
    k, min_gain = goal.stop.max_without_improvement, goal.stop.min_gain_pct
    if stale:
        why = f"{k} experiments in a row changed nothing"
    elif passing:
        why = f"the rules' best move is worth {passing[0][1].value:.3f} < {MIN_VALUE}"
    else:
        why = "no rule move passes the checks"
    props: list[Proposed] = []
    told = 0
    for proposer in of_phase("explore"):  # the explore-phase proposers (the explorer), pooled in registry order
        got = asked(proposer, Asking(history, diag), Exploring(why, restage))
        props, told = props + got.moves, max(told, got.told)
    infeasible = best_infeasible(history)
    best_ei = max((p.prediction.ei_pct for p in props if p.prediction is not None), default=0.0)
    if props and (infeasible or best_ei >= min_gain):
        p = props[0]
        assert p.value is not None  # an explore-phase move is valued
        if infeasible and p.prediction is not None:
            ranked.append(PlanRow.of(p.card.title(), p.value.value, f"the best station breaks the SLO: explore toward "
                                                                    f"feasibility ({p.prediction.text(goal.objective.metric)})"))
        else:
            ranked.append(PlanRow.of(p.card.title(), p.value.value, p.value.why))
        return Plan(card=p.card, diagnosis=diag, ranked=ranked, move=True)
    if infeasible and passing:  # getting feasible first: any rule move that passes, however small its value
        card, v = passing[0]
        ranked.append(PlanRow.of(card.title(), v.value, "the best station breaks the SLO: the budget goes on toward feasibility"))
        return Plan(card=card, diagnosis=diag, ranked=ranked, move=True)
    model = (f"the explorer expects at most {best_ei:.2f} % (< min_gain_pct {min_gain:g} %) from "
             f"{len(props)} proposal(s) over {told} valid run(s)" if props else
             f"the explorer has no untried one-change station that passes the checks ({told} valid run(s))")
    if stale:
        return Plan(card=None, diagnosis=diag, ranked=ranked, stop_reason=f"{why}, and {model}")
    if passing:
        return Plan(card=None, diagnosis=diag, ranked=ranked,
                    stop_reason=f"nothing left is worth its cost (best value {passing[0][1].value:.3f} < "
                                f"{MIN_VALUE}), and {model}")
    stop = no_candidate_reason(ranked, history)
    reason = stop.words
    if stop.kind not in (StopKind.BUDGET_SPENT, StopKind.ALL_REJECTED):
        reason += f", and {model}"
    return Plan(card=None, diagnosis=diag, ranked=ranked, stop_reason=reason)


def no_candidate_reason(ranked: list[PlanRow], history: History) -> Stop:
    """Why nothing passed: say so plainly when the budget is what refused the candidates left."""
    rejected, affordable = RefusalKind.REJECTED, RefusalKind.AFFORDABLE
    vetoed = [r for r in ranked if r.refused(rejected)]
    # not candidates at all (GONE): measured, a known negative, a change the evidence shows cannot move the objective
    if vetoed and all(r.refused(rejected, affordable, *GONE) for r in ranked):
        return Stop(StopKind.ALL_REJECTED, f"nothing left that was not rejected: {len(vetoed)} of the {len(ranked)} "
                                           f"remaining candidate(s) were rejected by a person or denied by the "
                                           f"authorisation table")
    unaffordable = [r for r in ranked if r.refused(affordable)]
    if unaffordable and all(r.refused(affordable, *GONE) for r in ranked):
        return Stop(StopKind.BUDGET_SPENT, f"budget spent: none of the {len(unaffordable)} remaining candidate(s) is "
                                           f"affordable ({history.budget_left_card_hours:.2f} card-h left)")
    why: dict[str, int] = {}
    for row in ranked:
        for r in row.refusals:
            why[r.kind.value] = why.get(r.kind.value, 0) + 1
    if not why:
        return Stop(StopKind.NO_CANDIDATE, "no candidate passes the checks")
    detail = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(why.items(), key=lambda kv: -kv[1]))
    return Stop(StopKind.NO_CANDIDATE, f"no candidate passes the checks ({len(ranked)} left: {detail})")

"""Loop KPIs (docs/protocol.md §9), computed from the store alone, per goal.

time to the first valid decision; the share of experiments that changed a decision; negatives
repeated under the same conditions (must be 0); invalid runs recorded as negatives (must be 0);
device time (card-hours) per percentage point of improvement over the baseline; the median absolute error of the
cards' predictions (the hypothesis ledger, core.ledger).
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from core.ledger import median_abs_error
from state.hypotheses import hypothesis_ledger
from state.memory import CONDITION_FIELDS


class LoopKPIs(BaseModel):
    model_config = ConfigDict(frozen=True)
    goal_id: str
    experiments: int  # runs with a result (restores excluded)
    valid_experiments: int
    seconds_to_first_valid_decision: float | None
    card_hours_to_first_valid_decision: float | None
    decision_changing_share: float | None  # experiments that changed a decision / experiments
    repeated_negatives: int
    invalid_negatives: int
    card_hours_used: float
    baseline_objective: float | None
    best_objective: float | None
    improvement_pct: float | None
    card_hours_per_point: float | None  # None when there was no improvement
    predictions_scored: int = 0  # runs whose card's prediction met an observed effect (core.ledger)
    median_abs_prediction_error: float | None = None  # on the objective, as a relative effect (0.05 = 5 points)


def _key(n: Any) -> tuple[Any, ...]:
    return (n.knob, repr(n.value)) + tuple(getattr(n.conditions, f) for f in CONDITION_FIELDS)


def compute_kpis(store: Any, goal_id: str) -> LoopKPIs:
    goal = store.get_goal(goal_id)
    results = {r.run_id: r for r in store.results(goal_id)}
    runs = [r for r in store.runs(goal_id) if r.stage != "restore" and r.id in results]
    decisions = store.decisions(goal_id)
    ledger = store.ledger(goal_id)

    first = next((d for d in decisions if d.run_id in results and results[d.run_id].valid), None)
    secs = ch_first = None
    if first is not None:
        secs = (first.created_at - goal.created_at).total_seconds()
        ch_first = sum(e.card_hours for e in ledger if e.created_at <= first.created_at)

    changed_runs = {d.run_id for d in decisions if d.changed and d.run_id}
    share = (sum(1 for r in runs if r.id in changed_runs) / len(runs)) if runs else None

    seen: set[tuple[Any, ...]] = set()
    repeated = 0
    for n in store.negatives(scenario=goal.spec.scenario):
        k = _key(n)
        if k in seen and n.goal_id == goal_id:
            repeated += 1
        seen.add(k)
    invalid = sum(1 for n in store.negatives(goal_id=goal_id)
                  if n.run_id is None or n.run_id not in results or not results[n.run_id].valid)

    def objective(run_id: str | None) -> float | None:
        res = results.get(run_id) if run_id else None
        if res is None or not res.valid or res.result.summary is None:
            return None
        return goal.spec.objective.value(res.result.summary)

    best_d = store.best(goal_id)
    best = objective(best_d.run_id if best_d else None)
    best_n = results[best_d.run_id].result.summary.n_formal if best is not None else None
    # the baseline measured like the best (same N: never a percentage across different N)
    bases = [objective(d.run_id) for d in decisions if d.kind == "baseline"
             if d.run_id in results and results[d.run_id].result.summary is not None
             and results[d.run_id].result.summary.n_formal == best_n]
    base = next((b for b in bases if b is not None), None)
    used = sum(e.card_hours for e in ledger)
    pct = (best - base) / base * 100.0 if base and best is not None else None
    rows = hypothesis_ledger(store, goal_id)
    return LoopKPIs(
        goal_id=goal_id, experiments=len(runs), valid_experiments=sum(1 for r in runs if results[r.id].valid),
        seconds_to_first_valid_decision=secs, card_hours_to_first_valid_decision=ch_first,
        decision_changing_share=share, repeated_negatives=repeated, invalid_negatives=invalid,
        card_hours_used=used, baseline_objective=base, best_objective=best, improvement_pct=pct,
        card_hours_per_point=(used / pct) if pct and pct > 0 else None,
        predictions_scored=sum(1 for r in rows if r.objective_error is not None),
        median_abs_prediction_error=median_abs_error(rows),
    )

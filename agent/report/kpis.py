"""The loop KPIs (docs/protocol.md §9) as lines: what `tuneloop run` prints at its end and the API's report text."""
from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Callable

from core.goalview import MAX_PCT, change
from core.ledger import Scored
from state.hypotheses import hypothesis_ledger
from state.kpis import LoopKPIs, compute_kpis

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store


def prediction_error(rows: list[Scored], fmt: Callable[[float], str]) -> str:
    """The headline prediction error: where the goal's twin predicted, the twin's own over every run it predicted
    (median and worst, naming that run), never the best subset; otherwise every source's median."""
    twin = [r for r in rows if r.prediction.source == "twin" and r.objective_error is not None]
    if twin:
        worst = max(twin, key=lambda r: r.objective_error or 0.0)
        med = statistics.median(r.objective_error for r in twin if r.objective_error is not None)
        return (f"the twin's absolute prediction error over the {len(twin)} run(s) it predicted: median {fmt(med)}, "
                f"worst {fmt(worst.objective_error or 0.0)} ({worst.title})")
    errs = [r.objective_error for r in rows if r.objective_error is not None]
    if not errs:
        return "median absolute prediction error: none scored yet"
    return f"median absolute prediction error {fmt(statistics.median(errs))} over {len(errs)} scored prediction(s)"


def improvement(k: LoopKPIs, unit: str) -> tuple[str | None, str | None]:
    """The improvement over the baseline (a percentage, or the two figures from a near-zero baseline) and the
    card-hours per point of it (none where no percentage is shown)."""
    shown = k.improvement_pct is not None and abs(k.improvement_pct) <= MAX_PCT * 100
    moved = f"{k.improvement_pct:+.2f} %" if shown else change(k.best_objective, k.baseline_objective, unit)
    per_point = f"{k.card_hours_per_point:.2f}" if shown and k.card_hours_per_point is not None else None
    return moved, per_point


def kpi_lines(store: Store, goal_id: str) -> list[str]:
    """The loop KPIs (docs/protocol.md §9) as lines, for the end of a run."""
    k = compute_kpis(store, goal_id)
    unit = store.get_goal(goal_id).spec.view().unit
    moved, per_point = improvement(k, unit)
    fmt = lambda v, f="{:.2f}": "—" if v is None else f.format(v)  # noqa: E731
    return ["KPIs:",
            f"  experiments {k.experiments} ({k.valid_experiments} valid), card-hours {k.card_hours_used:.2f}",
            f"  first valid decision after {fmt(k.seconds_to_first_valid_decision, '{:.1f}')} s "
            f"({fmt(k.card_hours_to_first_valid_decision)} card-h)",
            f"  share of experiments that changed a decision {fmt(k.decision_changing_share, '{:.0%}')}",
            f"  repeated negatives {k.repeated_negatives}, invalid runs recorded as negatives {k.invalid_negatives}",
            f"  objective {fmt(k.baseline_objective)} -> {fmt(k.best_objective)} {unit} ({moved or '—'}), "
            f"card-hours per point {per_point or '—'}",
            "  " + prediction_error(hypothesis_ledger(store, goal_id), "{:.1%}".format)]

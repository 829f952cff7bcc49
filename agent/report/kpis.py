"""The loop KPIs (docs/protocol.md §9) as lines: what `tuneloop run` prints at its end and the API's report text."""
from __future__ import annotations

from typing import TYPE_CHECKING

from state.kpis import compute_kpis

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store


def kpi_lines(store: Store, goal_id: str) -> list[str]:
    """The loop KPIs (docs/protocol.md §9) as lines, for the end of a run."""
    k = compute_kpis(store, goal_id)
    fmt = lambda v, f="{:.2f}": "—" if v is None else f.format(v)  # noqa: E731
    return ["KPIs:",
            f"  experiments {k.experiments} ({k.valid_experiments} valid), card-hours {k.card_hours_used:.2f}",
            f"  first valid decision after {fmt(k.seconds_to_first_valid_decision, '{:.1f}')} s "
            f"({fmt(k.card_hours_to_first_valid_decision)} card-h)",
            f"  share of experiments that changed a decision {fmt(k.decision_changing_share, '{:.0%}')}",
            f"  repeated negatives {k.repeated_negatives}, invalid runs recorded as negatives {k.invalid_negatives}",
            f"  objective {fmt(k.baseline_objective)} -> {fmt(k.best_objective)} "
            f"({fmt(k.improvement_pct, '{:+.2f}')} %), card-hours per point {fmt(k.card_hours_per_point)}",
            f"  median absolute prediction error {fmt(k.median_abs_prediction_error, '{:.1%}')} "
            f"over {k.predictions_scored} scored prediction(s)"]

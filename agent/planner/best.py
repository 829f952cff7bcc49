"""What the best station's latest valid run says about the goal's state: it breaks the SLO (the start may), or
its objective's native window is missing. Read by the ranking, the explorer and the stop rules alike."""
from __future__ import annotations

from agent.planner.history import History


def best_infeasible(history: History) -> bool:
    """The best station's latest valid run breaks the SLO (the start may)."""
    ref = history.latest_valid(history.best_knobs)
    return ref is not None and ref.figures is not None and bool(ref.figures.slo_violations)


def native_missing(history: History) -> bool:
    """The objective is read in the native window and the best station's latest run has none."""
    ref = history.latest_valid(history.best_knobs)
    return history.goal.objective.window == "native" and ref is not None and ref.summary is not None \
        and ref.summary.native is None

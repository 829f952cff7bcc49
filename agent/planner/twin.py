"""The goal's deployment twin, as the planner reads it: how well it predicts this goal's runs, figure by figure.

The twin is a simulator profile calibrated to the goal's own valid runs from a prior of the same structure
(executor/twin.py fits it; the loop hands the planner a fitter, `History.twin`, so the planner never imports the
simulator). Its prediction of a station is a whole Summary, made by the code that summarises a measured run with the
goal's SLOs (so every objective the schema allows, goodput included, and every latency at every statistic is
predicted). Its fidelity is measured, never assumed: every valid run is predicted by the twin fitted on the runs
before it (out of sample), and each figure the goal uses (core/goalview.py: the objective in the whole window and,
for a native goal, its own; each limit's figure at its own statistic) is scored apart, so a p99's interval is its
own, wider than a mean's. A figure's interval is INTERVAL_Z × the RMS of its measured errors, floored at the
run-to-run noise (CLEAR_LOSS); the objective's is never wider than the drift threshold (core.ledger), and a limit
figure's is as wide as its errors were (its chance of keeping the limit must carry them). The goal's first run is
predicted by the prior itself (the fit on no run); that error sets an interval only until a fitted twin's
prediction was scored; before any run was predicted every interval is the drift threshold.

The twin leads while it predicts this goal's runs: a run whose objective it missed outside its interval, or by more
than the least gain the goal cares about (stop.min_gain_pct; at least the run-to-run noise), whatever the interval
says, is a miss. A miss refits it (the missed run joins the fit); MISSES_TO_YIELD misses in a row, or a fit that
fails, hand the lead to the evidence rules and the explorer, and the cards say so. The search of the goal's space on
the twin is agent/planner/twin_space.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from agent.planner.history import History, Outcome
from agent.planner.judgement import CLEAR_LOSS
from agent.planner.twin_fit import Fitter, TwinFit  # noqa: F401  (what the planner reads from the twin)
from agent.planner.twin_space import (  # noqa: F401  (the twin's search, read through this module)
    OBJECTIVE_KEY, STATIONS_PER_PROPOSAL, Search, Station, figures, gain, predicted, prediction_of, runnable,
    search,
)
from agent.planner.value import INTERVAL_Z  # the twin's interval: ± INTERVAL_Z × the RMS of its measured errors
from core.goalview import effect
from core.ledger import DRIFT_THRESHOLD

MISSES_TO_YIELD = 2  # misses in a row before the twin hands the lead over (one miss refits it with the run it missed)
ERRORS_SHOWN = 3  # a card shows the twin's errors on the goal's last three runs (the rest are in the ledger)
PRIOR_INTERVAL = DRIFT_THRESHOLD  # before any run was predicted: the error at which a calibrated simulator is off


@dataclass(frozen=True)
class Scored:
    run_id: str
    predicted: float
    measured: float
    interval: float  # the twin's relative half-width of this figure when it predicted this run
    prior: bool = False  # predicted by the prior itself (the fit on no run)
    tolerance: float = math.inf  # the objective: an error past the goal's least gain is a miss whatever the interval

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0

    @property
    def miss(self) -> bool:
        return abs(self.error) > min(self.interval, self.tolerance)


@dataclass(frozen=True)
class Fidelity:
    twin: TwinFit | None  # the twin fitted on every valid run (None: no fit)
    scored: tuple[Scored, ...]  # the objective's (whole window), run by run
    interval: float  # the objective's relative half-width now
    leads: bool
    why: str
    figures: dict[str, tuple[Scored, ...]] = field(default_factory=dict)  # every figure the goal uses, run by run
    intervals: dict[str, float] = field(default_factory=dict)  # each figure's relative half-width now

    def words(self) -> str:
        if not self.scored:
            return f"no run predicted yet (interval ±{self.interval:.0%}, the drift threshold)"
        errs = ", ".join(f"{effect(s.error, tight=True)}{' (miss)' if s.miss else ''}" for s in self.scored[-ERRORS_SHOWN:])
        rest = "; ".join(f"{k} ±{v:.1%}" for k, v in self.intervals.items() if k != OBJECTIVE_KEY)
        return f"out-of-sample errors of its last runs {errs}; interval now ±{self.interval:.1%}" + (
            f" (limits: {rest})" if rest else "")


def runs_of(history: History) -> list[Outcome]:
    """The goal's valid runs in its scenario, in order, one per run id."""
    out, seen = [], set()
    for o in history.outcomes:
        if o.verdict == "valid" and o.summary is not None and o.summary.whole is not None and o.run_id \
                and o.card.scenario == history.goal.scenario and o.run_id not in seen:
            seen.add(o.run_id)
            out.append(o)
    return out


def _interval(scored: list[Scored], cap: float | None) -> float:
    """The interval from the fitted twin's errors; the prior's own error (the first run) only until a fit was
    scored: it measured the prior, not the twin calibrated since. `cap`: the objective's (the drift threshold)."""
    errors = [s.error for s in scored if not s.prior] or [s.error for s in scored]
    if not errors:
        return PRIOR_INTERVAL
    rms = math.sqrt(sum(e * e for e in errors) / len(errors))
    wide = max(CLEAR_LOSS, INTERVAL_Z * rms)
    return wide if cap is None else min(cap, wide)


def fidelity(history: History, fitter: Fitter) -> Fidelity:
    """The twin fitted on the goal's valid runs, and how well each prefix predicted the next run, figure by figure."""
    view = history.goal.view()
    tolerance = max(view.least_gain, CLEAR_LOSS)  # an error the goal's least gain cannot hide (nor the noise)
    runs = runs_of(history)
    if not runs:
        return Fidelity(None, (), PRIOR_INTERVAL, False, "no valid run to fit the twin to")
    per: dict[str, list[Scored]] = {k: [] for k in figures(view, None)}
    for k in range(len(runs)):  # the first run predicted by the prior itself (the fit on no run)
        fit = fitter(tuple(o.run_id for o in runs[:k]))  # type: ignore[misc]
        if isinstance(fit, str):
            continue
        o = runs[k]
        got = figures(view, prediction_of(history, fit, o.card.knobs, o.card.n).get("summary"))
        for name, y in figures(view, o.summary).items():
            p = got.get(name)
            if y and p:
                obj = name == OBJECTIVE_KEY
                per[name].append(Scored(o.run_id or "", float(p), float(y),
                                        _interval(per[name], PRIOR_INTERVAL if obj else None), prior=k == 0,
                                        tolerance=tolerance if obj else math.inf))
    scored = per[OBJECTIVE_KEY]
    fit = fitter(tuple(o.run_id for o in runs))  # type: ignore[misc]
    intervals = {k: _interval(v, PRIOR_INTERVAL if k == OBJECTIVE_KEY else None) for k, v in per.items()}
    interval = intervals[OBJECTIVE_KEY]
    kept = {k: tuple(v) for k, v in per.items()}
    if isinstance(fit, str):
        return Fidelity(None, tuple(scored), interval, False, f"the twin cannot be fitted: {fit}", kept, intervals)
    tail = scored[-MISSES_TO_YIELD:]
    if len(tail) == MISSES_TO_YIELD and all(s.miss for s in tail):
        return Fidelity(fit, tuple(scored), interval, False,
                        f"the twin missed its last {MISSES_TO_YIELD} runs outside its interval or the least gain "
                        f"({', '.join(f'{effect(s.error, tight=True)} vs ±{min(s.interval, s.tolerance):.1%}' for s in tail)}): "
                        f"re-calibrating did not bring it back, so the evidence rules and the explorer lead",
                        kept, intervals)
    return Fidelity(fit, tuple(scored), interval, True, "", kept, intervals)

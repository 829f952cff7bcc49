"""The hypothesis ledger: every card's numeric prediction, the effect its run observed, and how far apart they were.

A `Prediction` is a relative effect (0.10 = +10 %) on the goal's objective and on its binding SLO figure (the
latency limit with the least headroom at the parent), each a point with an interval, and its source: the value
model (agent/planner/value.py), an explorer's surrogate model, a calibrated simulator, or the goal's twin (a simulator
calibrated to the goal's own runs). An `Observation` is the same two effects measured against the parent's reference
at the same N. Errors are absolute differences of relative
effects (0.05 = 5 percentage points); the KPI is their median.
"""
from __future__ import annotations

import statistics
from typing import Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from core.errors import FieldError
from core.evidence_parts import Drift
from core.goalview import MAX_PCT, GoalView, figure_named
from core.summary import Summary

# a target's default `drift_threshold`; the pre-screen's interval around a simulated effect is the same gap
DRIFT_THRESHOLD = 0.15  # the relative gap between a calibrated simulator's prediction and a run that flags drift
Source = Literal["value_model", "explorer", "simulator", "twin"]
SOURCES: tuple[str, ...] = ("value_model", "explorer", "simulator", "twin")


class Interval(BaseModel):
    """A relative effect: the point estimate and the interval it is expected inside."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    value: float
    lo: float
    hi: float

    @model_validator(mode="after")
    def _ordered(self) -> "Interval":
        if not self.lo <= self.value <= self.hi:
            raise FieldError("interval", f"need lo <= value <= hi, got {self.lo} <= {self.value} <= {self.hi}")
        return self

    def contains(self, x: float) -> bool:
        return self.lo <= x <= self.hi


class Prediction(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    source: Source
    objective: str  # the goal's objective, e.g. "output_tok_s_per_card (native)"
    objective_effect: Interval
    slo: str | None = None  # the binding SLO's limit, e.g. "tpot_mean_ms_lt"
    slo_effect: Interval | None = None  # relative change of that SLO's figure (e.g. mean TPOT)
    basis: str = ""  # what the numbers rest on, in words
    predicted: dict[str, float] = Field(default_factory=dict)  # absolute figures where the source has them


class Observation(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    objective_effect: float | None = None
    slo_effect: float | None = None
    window: str | None = None  # the objective's window used (native, else whole, as both runs have it)
    against: str | None = None  # the reference run the effects are measured against
    note: str = ""


class Scored(BaseModel):
    """One ledger row: a card's prediction, what its run observed, and the errors."""

    model_config = ConfigDict(frozen=True)
    candidate_id: int
    run_id: str | None
    title: str
    prediction: Prediction
    observation: Observation | None
    objective_error: float | None
    slo_error: float | None
    objective_inside: bool | None  # the observed effect lies inside the predicted interval


def score(candidate_id: int, run_id: str | None, title: str, pred: Prediction, obs: Observation | None) -> Scored:
    oe = se = None
    inside = None
    if obs is not None and obs.objective_effect is not None:
        oe = abs(obs.objective_effect - pred.objective_effect.value)
        inside = pred.objective_effect.contains(obs.objective_effect)
    if obs is not None and obs.slo_effect is not None and pred.slo_effect is not None:
        se = abs(obs.slo_effect - pred.slo_effect.value)
    return Scored(candidate_id=candidate_id, run_id=run_id, title=title, prediction=pred, observation=obs,
                  objective_error=oe, slo_error=se, objective_inside=inside)


def median_abs_error(rows: Iterable[Scored]) -> float | None:
    """The median absolute prediction error on the objective over the rows that have an observed effect."""
    errs = [r.objective_error for r in rows if r.objective_error is not None]
    return statistics.median(errs) if errs else None


def by_source(rows: list[Scored]) -> dict[str, dict[str, float | int | None]]:
    """Per source of prediction: rows, scored rows, median errors (objective, SLO), share inside the interval."""
    out: dict[str, dict[str, float | int | None]] = {}
    for src in SOURCES:
        mine = [r for r in rows if r.prediction.source == src]
        if not mine:
            continue
        scored = [r for r in mine if r.objective_error is not None]
        slo = [r.slo_error for r in mine if r.slo_error is not None]
        inside = [r.objective_inside for r in scored]
        out[src] = {"cards": len(mine), "scored": len(scored), "median_abs_error": median_abs_error(mine),
                    "median_abs_slo_error": statistics.median(slo) if slo else None,
                    "inside_interval_share": sum(1 for x in inside if x) / len(inside) if inside else None}
    return out


def relative(new: float | None, old: float | None) -> float | None:
    """new / old - 1, or None where either is missing or the old figure is not positive."""
    if new is None or old is None or old <= 0:
        return None
    return new / old - 1.0


def drift_line(d: Drift | None) -> str | None:
    """One line for the card, the report and STATE.md from a run's drift record (executor.drift)."""
    if d is None:
        return None
    if d.error is not None or d.predicted is None or d.measured is None or d.drift is None:
        return f"DRIFT: {d.error} — {d.suggestion}"
    p, m, dr = d.predicted, d.measured, d.drift
    fig = lambda v, f: "—" if v is None else f.format(v)  # noqa: E731
    text = (f"simulator ({d.profile}) predicted {fig(p.output_tok_s, '{:.1f}')} tok/s, "
            f"TPOT {fig(p.tpot_mean_ms, '{:.1f}')} ms; measured {fig(m.output_tok_s, '{:.1f}')} tok/s, "
            f"TPOT {fig(m.tpot_mean_ms, '{:.1f}')} ms (drift {fig(dr.output_tok_s, '{:+.0%}')} / "
            f"{fig(dr.tpot_mean_ms, '{:+.0%}')}, limit {d.threshold:.0%})")
    return ("DRIFT: " + text + " — " + str(d.suggestion)) if d.flagged else "drift within limit: " + text


def interval_words(eff: Interval | dict[str, Any] | None, base: float | None = None, unit: str = "",
                   point: float | None = None) -> str | None:
    """A predicted relative effect and its interval as a person reads it: `+12.0 % (interval +8.0 % to +16.0 %)`;
    where the interval reaches past +-1000 % (a near-zero parent), the figures: `0.07 -> 6.60 req/s (interval 6.60 to
    6.61)` from the parent's figure `base`, else the predicted `point` and the factor (`6.60 req/s, x94.4 (interval
    x94.3 to x94.4)`)."""
    if eff is None:
        return None
    e = eff if isinstance(eff, Interval) else Interval.model_validate(eff)
    if max(abs(e.lo), abs(e.hi)) <= MAX_PCT:
        return f"{e.value * 100:+.1f} % (interval {e.lo * 100:+.1f} % to {e.hi * 100:+.1f} %)"
    u = f" {unit}" if unit else ""
    if base is not None and base > 0:
        return (f"{base:.2f} -> {base * (1 + e.value):.2f}{u} (interval {base * (1 + e.lo):.2f} to "
                f"{base * (1 + e.hi):.2f})")
    return (f"{point:.2f}{u}, " if point is not None else "") + f"x{1 + e.value:.1f} (interval x{1 + e.lo:.1f} to x{1 + e.hi:.1f})"


def prediction_words(pred: Prediction | dict[str, Any] | None, view: GoalView, base: Summary | None = None,
                     measured: Summary | None = None) -> list[str]:
    """A card's prediction beside what its run measured, in the goal's own figures (core.goalview): the objective's
    effect with its interval (against `base`, the run it was predicted against, where known), the binding limit's,
    each absolute figure it predicted, its source; then the measured figures. Empty: no numeric prediction."""
    if not pred:
        return []
    try:
        p = pred if isinstance(pred, Prediction) else Prediction.model_validate(pred)
    except ValidationError:  # a card written by another version: said so, never guessed
        return ["a prediction this version cannot read"]
    window = "native" if "(native)" in p.objective else "whole"
    obj = view.objective(base, window) if base is not None else None
    out = [f"{p.objective}: " + str(interval_words(p.objective_effect, obj, view.unit, p.predicted.get(view.metric)))]
    if p.slo and p.slo_effect is not None:
        lim = next((x for x in view.limits if x.key == p.slo), None)
        was = lim.figure(base) if lim is not None else None
        out.append(f"{lim.words if lim else p.slo}: {interval_words(p.slo_effect, was, 'ms')}")
    figs = [f"{figure_named(k).words.removesuffix(' ms')} {v:.2f}" + (" ms" if k.endswith("_ms") else f" {view.unit}")
            for k, v in p.predicted.items() if k != view.metric and k.endswith("_ms")]
    if view.metric in p.predicted:
        figs.insert(0, f"{view.metric} {p.predicted[view.metric]:.2f} {view.unit}")
    if figs:
        out.append("predicted figures: " + ", ".join(figs))
    out.append(f"source: {p.source}")
    if measured is not None:
        out.append("measured: " + view.figures_words(measured))
    return out

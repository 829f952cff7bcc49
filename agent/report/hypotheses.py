"""The report's hypothesis ledger: each card's numeric prediction beside the effect its run observed, and the
errors per source of prediction (value model, explorer, calibrated simulator)."""
from __future__ import annotations

from typing import Any

from agent.report.blocks import Block, Cell, Heading, Para, Table
from core.evidence_parts import Drift
from core.goalview import effect
from agent.report.kpis import prediction_error
from core.ledger import Interval, Scored, by_source, drift_line, interval_words


def pct(x: float | None) -> str:
    """A relative effect: `+12.3 %`, beyond +-1000 % the factor (`x93.3`: such a percentage says nothing)."""
    return effect(x) or ""


def points(x: float | None) -> str:
    return "" if x is None else f"{x * 100:.1f} pt"


def interval(i: Interval | None) -> str:
    return interval_words(i) or ""


def section(rows: list[Scored]) -> list[Block]:
    out: list[Block] = [Heading(2, "Hypothesis ledger: predicted vs observed", "hypotheses"),
                        Para("Every card's numeric prediction (relative effect on the objective and on the binding "
                             "SLO figure, with its interval and source) beside what its run measured against the "
                             "parent's reference at the same N. Errors are absolute differences in percentage "
                             "points.", "muted")]
    if not rows:
        return out + [Para("No judged run carries a prediction yet.", "hypotheses none")]
    out.append(Table(
        ("run", "card", "source", "objective predicted", "objective observed", "error", "inside", "SLO",
         "SLO predicted", "SLO observed", "SLO error", "basis"),
        tuple((Cell(r.run_id or ""), Cell(r.title), Cell(r.prediction.source, "source"),
               Cell(interval(r.prediction.objective_effect), "predicted"),
               Cell(pct(r.observation.objective_effect if r.observation else None)
                    or (r.observation.note if r.observation else "not observed"), "observed"),
               Cell(points(r.objective_error), "error num"),
               Cell("" if r.objective_inside is None else "yes" if r.objective_inside else "no", "inside"),
               Cell(r.prediction.slo or ""), Cell(interval(r.prediction.slo_effect), "slo-predicted"),
               Cell(pct(r.observation.slo_effect if r.observation else None), "slo-observed"),
               Cell(points(r.slo_error), "slo-error num"), Cell(r.prediction.basis))
              for r in rows), "hypotheses", tuple(r.run_id or "" for r in rows)))
    src = by_source(rows)
    out.append(Table(("source", "cards", "scored", "median abs error (objective)", "median abs error (SLO)",
                      "observed inside the interval"),
                     tuple((Cell(s, "source"), Cell(str(v["cards"]), "num"), Cell(str(v["scored"]), "num"),
                            Cell(points(v["median_abs_error"]), "num"), Cell(points(v["median_abs_slo_error"]), "num"),
                            Cell("" if v["inside_interval_share"] is None else f"{v['inside_interval_share']:.0%}",
                                 "num")) for s, v in src.items()), "hypotheses-sources", tuple(src)))
    head = prediction_error(rows, points)  # the twin's own over every run it predicted, where it predicted
    out.append(Para(head[0].upper() + head[1:] + ".", "hypotheses kpi"))
    return out


def drift_paras(drifts: list[tuple[str, Drift | None]]) -> list[Block]:
    """A warning at the top of the report for each run whose simulator prediction drifted past the limit."""
    return [Para(f"Simulator drift in run {rid}: {drift_line(d)}", "drift flagged") for rid, d in drifts
            if d is not None and d.flagged]


def predicted_negatives(notes: list[Any]) -> list[Block]:
    """Screens the calibrated simulator set aside unrun: predictions, never measured negatives."""
    rows = [(n, n.data["predicted_negative"]) for n in notes if isinstance((n.data or {}).get("predicted_negative"), dict)]
    if not rows:
        return []
    return [Heading(3, "Set aside unrun: predicted negative (a prediction, not a measured negative)", "predicted-negatives"),
            Table(("candidate", "change", "why", "predicted objective", "predicted SLO", "run it anyway"),
                  tuple((Cell(str(n.candidate_id)), Cell(f"{p['knob']}={p['value']!r}"), Cell(p["why"]),
                         Cell(interval(Interval.model_validate(p["prediction"]["objective_effect"]))),
                         Cell(interval(Interval.model_validate(p["prediction"]["slo_effect"]))
                              if p["prediction"].get("slo_effect") else ""),
                         Cell(n.text.rsplit("to run it anyway: ", 1)[-1], "command")) for n, p in rows),
                  "predicted-negatives", tuple(str(n.candidate_id) for n, _ in rows))]

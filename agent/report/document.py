"""The report's sections, in the order a person reads them: the answer first (the best station, its gain in
both windows, the experiments that decided it, the frontier, why the loop stopped), what people decided, how to
get back to the best, the pictures, what was tried and why, the trade-offs, and only then the configuration it
ran under and what the loop cost.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy.engine import make_url

from agent.report.blocks import (
    Block,
    Cell,
    Code,
    Heading,
    Image,
    Items,
    Para,
    Table,
    kv,
)
from agent.report import answer, engine_commands, people
from agent.report.build import Report, parent_run
from agent.report.content import Content, Experiment, objective_of
from agent.report.hypotheses import drift_paras, points, predicted_negatives
from agent.report.hypotheses import section as hypotheses_section
from agent.report.tradeoffs import TradeRow
from agent.report.kpis import improvement, prediction_error
from core.goalview import effect
from core.ledger import drift_line, interval_words, prediction_words

LAYOUT_KNOBS = ("num_prefill_instances", "num_decode_instances", "expert_layout", "parallel")
PLOT_ORDER = ("queues", "prefill_batches", "progress")  # after the frontier plots (Report.frontiers), in this order


def fmt(v: Any, digits: int = 2) -> str:
    """A figure as text; a missing figure is an empty string, never 0."""
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def window(n: int | None, seconds: float | None) -> str:
    return "" if n is None or seconds is None else f"{n} req · {seconds:.1f} s"


def short_reason(reason: str | None) -> str:
    """Why a native window is invalid, without the figure it 'would have given' (that is not a figure)."""
    return ("no valid window: " + reason.split(" (window")[0]) if reason else "no valid window"


def document(rep: Report) -> list[Block]:
    c = rep.content
    g = c.goal
    out: list[Block] = [Heading(1, f"tuneloop report — goal {g.id} ({g.spec.name}): {g.status}")]
    first = answer.section(rep)
    out += first[:2]  # the answer's own table first: what the first screen shows
    out += drift_paras([(e.run.id, e.result.evidence.drift if e.result else None) for e in c.experiments])
    out += first[2:] + people.section(c.people, c.auto_approvals) + _best(c) + engine_commands.section(c) \
        + _pending(c) \
        + _plots(rep) + _log(c) + _tradeoffs(c) + hypotheses_section(c.hypotheses) + predicted_negatives(c.notes) \
        + _goal(c) + _definitions(c) + _kpis(c)
    out.append(Para(f"Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC from the store "
                    f"{_redacted(c.store_url)}.", "muted"))
    return out


def _redacted(url: str) -> str:

    return make_url(url).render_as_string(hide_password=True)


def _goal(c: Content) -> list[Block]:
    s = c.goal.spec
    cons = s.constraints.model_dump(exclude_none=True)
    return [Heading(2, "Goal, fixed scenario and contract", "goal"),
            kv([("name", s.name), ("engine", s.engine), ("target", s.target), ("simulator profile", s.sim_profile),
                ("objective", f"maximise {s.view().objective_words}"), ("SLO", s.view().slo_words()),
                ("constraints (SLO)", ", ".join(f"{k}={v}" for k, v in cons.items())),
                ("reported", ", ".join(s.reported)),
                ("protocol", f"screen N={s.protocol.screen_n}, confirm N={s.protocol.confirm_n}, warm-up "
                             f"{s.protocol.warmup}, native window ≥ {s.protocol.native_min_requests} requests and "
                             f"≥ {s.protocol.native_min_seconds:g} s, seeds {list(s.protocol.seeds)}"),
                ("authorisation", ", ".join(f"{k}: {v}" for k, v in s.authorisation.items())),
                ("budget", f"{s.budget.card_hours:g} card-hours, {s.budget.experiments} experiments"
                           + (f", deadline {s.budget.deadline}" if s.budget.deadline else ""))], "kv goal"),
            Heading(3, "Fixed scenario (never changed by the loop)"),
            kv([(k, v) for k, v in c.scenario.items()], "kv scenario"),
            Heading(3, "Contract a valid run keeps"),
            kv([(k, v) for k, v in c.contract.items()], "kv contract")]


def _definitions(c: Content) -> list[Block]:
    out: list[Block] = [Heading(2, "Metric definitions", "definitions")]
    return out + [Para(f"Definitions {c.definitions_from}.", "muted"), Table(("metric", "definition"), tuple((Cell(k, "key"), Cell(v)) for k, v in
                                                        sorted(c.definitions.items())), "definitions",
                        tuple(sorted(c.definitions)))]


def _best(c: Content) -> list[Block]:
    out: list[Block] = [Heading(2, "Best deployable station", "best")]
    st, e = c.best_station, c.best
    if st is None:
        return out + [Para("No deployable best station yet.", "best none")]
    s = e.summary if e else None
    layout = [(k, st.knobs[k]) for k in LAYOUT_KNOBS if k in st.knobs] + [("cards in use", s.cards if s else None)]
    out += [kv([("station", st.hash), ("engine", st.engine), ("target", st.target), ("scenario", st.scenario),
                ("data version", st.data_version), ("source identity", st.source_identity),
                ("decided by", f"run {e.index} ({e.run.id}): {e.outcome.text if e and e.outcome else ''}" if e else ""),
                ("objective figure", f"{fmt(_objective(c, e))} ({c.goal.spec.objective.window}, N={e.run.n})" if e else "")],
               "kv best"),
            Heading(3, "Layout"), kv(layout, "kv layout"),
            Heading(3, "Knobs"), kv(sorted(st.knobs.items()), "kv knobs"),
            Heading(3, "Go back to this station (one command)"), Code(c.restore_command or "", "restore")]
    return out


def _objective(c: Content, e: Experiment | None) -> float | None:

    return objective_of(c.goal, e.summary) if e else None


def _pending(c: Content) -> list[Block]:
    """Performance-positive stations waiting for their quality evaluation; those whose evaluation failed apart,
    under their own heading."""
    out: list[Block] = [Heading(2, "Quality pending (not deployable)", "pending")]
    if not c.pending:
        out.append(Para("None: no quality-risk change is waiting for an accuracy evaluation.", "pending none"))
    else:
        out.append(_station_rows(c, c.pending, "performance-positive, quality pending", "pending"))
    if c.quality_failed:
        out += [Heading(2, "Quality evaluation failed (never deployable)", "quality-failed"),
                _station_rows(c, c.quality_failed, "quality evaluation failed: never deployable", "quality-failed")]
    return out


def _station_rows(c: Content, es: list[Experiment], status: str, cls: str) -> Table:
    return Table(("station", "change", "objective", "N", "status"),
                 tuple((Cell(e.station or ""), Cell(e.change), Cell(fmt(_objective(c, e)), "num"), Cell(str(e.run.n)),
                        Cell(status)) for e in es), cls, tuple(e.run.id for e in es))


def _log(c: Content) -> list[Block]:
    out: list[Block] = [Heading(2, "Decision log", "log")]
    if not c.experiments:
        return out + [Para("No experiment has run yet.")]
    for e in c.experiments:
        out += _experiment(c, e)
    if c.stop is not None:
        out += [Heading(3, "Stop"), Para(f"The loop stopped: {c.stop.text}", "stop")]
    return out


def _changes(card: dict) -> list[dict]:
    """A stored card's changes: one, a coupled pair's two, or a twin's jump's several (tested together)."""
    return [c for c in (card.get("change"), card.get("also"), *(card.get("more") or ())) if c]


def _experiment(c: Content, e: Experiment) -> list[Block]:
    card = e.card
    diag = card.get("diagnosis") or {}
    lead = max(diag.get("hypotheses") or [{}], key=lambda h: h.get("likelihood", 0.0))
    out: list[Block] = [
        Heading(3, f"{e.index}. {card.get('stage', e.run.stage)} N={e.run.n}: {e.change}", f"run-{e.run.id}"),
        kv([("run", e.run.id), ("station", e.station), ("parent station", e.parent), ("the changes" if len(_changes(card)) > 1 else "the one change", e.change),
            ("hypothesis", card.get("hypothesis")), ("mechanism", card.get("mechanism")),
            ("decision it affects", card.get("decision")), ("expected effect", card.get("expected_effect")),
            ("a negative would rule out", card.get("negative_rules_out")), ("cost class", card.get("cost_class")),
            ("quality risk", card.get("quality_risk")), ("planner", card.get("planner"))]
           + ([("diagnosis (lead)", f"{lead.get('name')} ({lead.get('likelihood', 0):.2f}): "
                + "; ".join(lead.get("evidence_for") or []))] if lead.get("name") else [])
           + [("evidence", e.evidence)] * bool(e.evidence)
           + [("simulator drift", drift_line(d)) for d in [e.result.evidence.drift if e.result else None] if d]
           + _prediction(c, e), f"kv card run-{e.run.id}"),
        Para(f"Verdict: {e.verdict}", f"verdict run-{e.run.id}"),
    ]
    reasons = [f"{r.code}: {r.message}" for r in e.result.verdict.reasons] if e.result else []
    reasons += [f"SLO: {v}" for v in e.slo_violations]
    if e.result and e.result.error:
        reasons.append(f"error in phase {e.result.failed_phase}: {e.result.error}")
    out.append(Items(tuple(reasons) if reasons else ("no reasons: every contract check passed",), f"reasons run-{e.run.id}"))
    s = e.summary
    cols = c.goal.spec.view().columns()
    if s is not None:
        out.append(Table(
            ("N formal", "ok / failed", "whole", "whole window", "native", "native window") + tuple(f.words for f in cols),
            ((Cell(str(s.n_formal), "num"), Cell(f"{s.n_ok} / {s.n_failed}"), _fig(s.whole, c, "whole"),
              Cell(window(s.whole.n_requests, s.whole.duration) if s.whole else "", "whole-window"),
              _fig(s.native, c, "native"),
              Cell(window(s.native.n_requests, s.native.duration) if s.native else short_reason(s.native_reason),
                   "native-window")) + tuple(Cell(f.text(s), "num") for f in cols),),
            f"figures run-{e.run.id}", (e.run.id,)))
    else:
        out.append(Para("No figures: this run produced no summary.", f"figures none run-{e.run.id}"))
    d = e.outcome
    out.append(kv([("decision", d.kind if d else "not judged"), ("why", d.text if d else ""),
                   ("ruled out", e.ruled_out), ("device time", f"{e.card_hours:.3f} card-hours")]
                  + [(f"also: {x.kind}", x.text) for x in e.decisions if x is not d], f"kv decision run-{e.run.id}"))
    return out


def _prediction(c: Content, e: Experiment) -> list[tuple[str, str]]:
    """The card's numeric prediction beside what its run measured (the goal's own figures), and how far apart."""
    words = prediction_words(e.card.get("prediction"), c.goal.spec.view(), getattr(parent_run(c.experiments, e),
                                                                                   "summary", None), e.summary)
    if not words:
        return []
    out = [("prediction", "; ".join(w for w in words if not w.startswith("measured: ")))]
    out += [("measured", w.removeprefix("measured: ")) for w in words if w.startswith("measured: ")]
    row = next((h for h in c.hypotheses if h.run_id == e.run.id and h.objective_error is not None), None)
    if row is not None and row.observation is not None:
        inside = "inside" if row.objective_inside else "outside"
        out.append(("predicted vs observed", f"observed {effect(row.observation.objective_effect)} vs predicted "
                    f"{interval_words(row.prediction.objective_effect)}: {inside} the interval, off by "
                    f"{row.objective_error * 100:.1f} points"))
    return out


def _fig(w: Any, c: Content, cls: str) -> Cell:
    return Cell(fmt(getattr(w, c.goal.spec.objective.metric)) if w is not None else "", f"{cls} num")


def _tradeoffs(c: Content) -> list[Block]:
    view = c.goal.spec.view()
    cols = view.columns()
    out: list[Block] = [Heading(2, "Trade-offs per scenario", "tradeoffs"),
                        Para(f"Valid runs, one row per station and N ({view.objective_words}; the goal's SLO: "
                             f"{view.slo_words()}). Whole and native are separate "
                             "columns; the native cell is empty where the run had no valid native window. "
                             "Tables of different N are never compared as a percentage.", "muted")]
    if not c.tradeoffs:
        return out + [Para("No valid run yet.")]
    for sc, by_n in c.tradeoffs.items():
        out.append(Heading(3, f"Scenario {sc}"))
        for n, rows in by_n.items():
            out += [Heading(4, f"N = {n}"), Table(
                ("station", "change", "decision", "frontier", "whole", "whole window", "native", "native window",
                 "vs parent (same N)") + tuple(f.words for f in cols) + ("SLO",),
                tuple(_trow(r, cols) for r in rows), f"tradeoff n-{n}", tuple(r.run_id for r in rows))]
    return out


def _trow(r: TradeRow, cols: tuple[Any, ...]) -> tuple[Cell, ...]:
    return (Cell(r.station or "", "station"), Cell(r.change), Cell(r.status, "decision"),
            Cell("yes" if r.frontier else "", "frontier"), Cell(fmt(r.whole), "whole num"),
            Cell(window(r.whole_n, r.whole_s), "whole-window"), Cell(fmt(r.native), "native num"),
            Cell(window(r.native_n, r.native_s) if r.native is not None else short_reason(r.native_reason),
                 "native-window"),
            Cell(r.vs_reference or "", "vs")) + tuple(Cell(fmt(r.figures.get(f.key), f.digits), "num") for f in cols) \
        + (Cell("met" if r.slo_ok else "broken", "slo"),)


def _plots(rep: Report) -> list[Block]:
    out: list[Block] = [Heading(2, "Plots", "plots")]
    for i, name in enumerate(rep.frontiers + PLOT_ORDER):
        if i == 0 and name in rep.frontiers and name in rep.plots:
            out.append(Para(f"{rep.plots[name].title}: with the frontier in the answer above.", "muted"))
        elif name in rep.plots:
            p = rep.plots[name]
            out.append(Image(p.name, p.title, p.caption, p.png))
        elif name in rep.missing:
            out.append(Para(f"{name}: not drawn — {rep.missing[name]}", "missing"))
    return out


def _kpis(c: Content) -> list[Block]:
    k, b = c.kpis, c.budget
    moved, per_point = improvement(k, c.goal.spec.view().unit)
    pct = None if k.improvement_pct is None or moved is None else f"{moved} (same N as the best)"
    rows = [("experiments (valid)", f"{k.experiments} ({k.valid_experiments})"),
            ("time to the first valid decision", fmt(k.seconds_to_first_valid_decision, 1) + " s"
             if k.seconds_to_first_valid_decision is not None else ""),
            ("card-hours to the first valid decision", fmt(k.card_hours_to_first_valid_decision, 3)),
            ("share of experiments that changed a decision", fmt(k.decision_changing_share, 3)),
            ("negatives repeated (must be 0)", k.repeated_negatives),
            ("invalid runs recorded as negatives (must be 0)", k.invalid_negatives),
            ("baseline objective", fmt(k.baseline_objective)), ("best objective", fmt(k.best_objective)),
            ("improvement", pct or ""), ("card-hours used", fmt(k.card_hours_used, 3)),
            ("card-hours per point of improvement", fmt(k.card_hours_per_point, 3) if per_point is not None else
             "" if k.improvement_pct is None else "— (the baseline is near zero: no percentage)"),
            ("prediction error (absolute, on the objective)", prediction_error(c.hypotheses, points))]
    by_kind = sorted(c.ledger_summary["by_kind"].items())
    return [Heading(2, "Loop KPIs", "kpis"), kv(rows, "kv kpis"),
            Heading(2, "Budget ledger", "ledger"),
            kv([("card-hours", f"{b.card_hours_used:.3f} used of {b.card_hours_limit:g} ({b.card_hours_left:.3f} left)"),
                ("experiments", f"{b.experiments_used} used of {b.experiments_limit} ({b.experiments_left} left)"),
                ("deadline", f"{b.deadline} ({'passed' if b.deadline_passed else 'not passed'})" if b.deadline else "none")],
               "kv budget"),
            Table(("cost item", "card-hours"), tuple((Cell(w), Cell(f"{h:.3f}", "num")) for w, h in by_kind)
                  + ((Cell("total", "key"), Cell(f"{c.ledger_summary['total']:.3f}", "num total")),),
                  "ledger-kinds", tuple(w for w, _ in by_kind) + ("total",)),
            Table(("run", "item", "seconds", "cards", "card-hours"),
                  tuple((Cell(e.run_id), Cell(e.what), Cell(f"{e.seconds:.1f}", "num"), Cell(str(e.cards), "num"),
                         Cell(f"{e.card_hours:.4f}", "num")) for e in c.ledger), "ledger",
                  tuple(e.run_id for e in c.ledger))]

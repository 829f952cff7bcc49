"""The report's first section: the answer before how it was found. The best station and its knobs, its gain over
the reference in both windows (whole and native, each only where both runs have a valid one), the experiments
that changed a decision, the frontier with its plot, and why the loop stopped: what a person reads first and may
stop reading after. The configuration, the full log and the tables follow it.
"""
from __future__ import annotations

from dataclasses import dataclass

from agent.report.blocks import Block, Cell, Heading, Image, Table, kv
from agent.report.build import Report
from agent.report.content import Content
from agent.report.experiment import Experiment
from core.goalview import change


@dataclass(frozen=True)
class Gain:
    window: str
    best: float | None
    reference: float | None

    @property
    def pct(self) -> float | None:
        return None if self.best is None or not self.reference else (self.best / self.reference - 1.0) * 100.0


def reference_of(c: Content) -> Experiment | None:
    """The run the gain is measured against: the first valid baseline (reference) run at the best's N, as the
    loop KPIs take it (state.kpis: never a percentage across different N)."""
    if c.best is None or c.best.summary is None:
        return None
    n = c.best.summary.n_formal
    return next((e for e in c.experiments if e.verdict == "valid" and e.summary is not None
                 and e.summary.n_formal == n and any(d.kind == "baseline" for d in e.decisions)), None)


def gains(c: Content) -> list[Gain]:
    """The best's objective metric over the reference's, whole window and native window apart."""
    ref, metric = reference_of(c), c.goal.spec.objective.metric
    out = []
    for w in ("whole", "native"):
        fig = [getattr(getattr(e.summary, w), metric) if e and e.summary and getattr(e.summary, w) else None
               for e in (c.best, ref)]
        out.append(Gain(w, fig[0], fig[1]))
    return out


def _gain_text(g: Gain, c: Content, ref: Experiment | None) -> str:
    if ref is None:
        return "no reference run at the best's N to compare with"
    if g.pct is None:
        lacking = [f"run {e.index}" for e in (c.best, ref) if e and getattr(e.summary, g.window) is None]
        return f"no valid {g.window} window in {' and '.join(dict.fromkeys(lacking))}: no gain in this window"
    same = " (the best is the reference itself: nothing beat it)" if ref is c.best else ""
    view = c.goal.spec.view()
    return (f"{change(g.best, g.reference, view.unit)} ({g.best:.2f} vs {g.reference:.2f} {view.unit}, run "
            f"{c.best.index} vs reference run {ref.index} at N={ref.summary.n_formal}){same}")


def stop_reason(c: Content) -> str:
    if c.stop is not None:
        return c.stop.text
    g = c.goal
    return f"not stopped: the goal is {g.status}" + (f" — {g.status_reason}" if g.status_reason else "")


def section(rep: Report) -> list[Block]:
    c = rep.content
    st, best = c.best_station, c.best
    spec = c.goal.spec
    ref = reference_of(c)
    if st is None:
        head = "none yet: no valid measured station"
    elif best is None:
        head = f"{st.hash} (its run is not one of this goal's experiments)"
    else:
        head = f"{st.hash} (run {best.index}: {best.outcome.kind if best.outcome else 'not judged'}, N={best.run.n})"
    rows = [("best station", head)]
    rows += [(f"gain, {g.window} window" + (" (the objective's)" if g.window == spec.objective.window else ""),
              _gain_text(g, c, ref)) for g in gains(c)]
    view = spec.view()
    rows += [("stopped because", stop_reason(c)),
             ("objective", f"maximise {view.objective_words}"), ("SLO", view.slo_words())]
    if best is not None and best.summary is not None:
        rows.append(("the best's figures", view.figures_words(best.summary)))
    out: list[Block] = [Heading(2, "The answer", "answer"), kv(rows, "kv answer")]
    if st is not None:
        out += [Heading(3, "Knobs of the best station"), kv(sorted(st.knobs.items()), "kv answer-knobs")]
    out += _decisive(c) + _frontier(rep)
    return out


def made_best(c: Content) -> list[Experiment]:
    """Exactly the runs that made the best station, in run order: the best's run, its parent station's run before it
    (at its N, else any), and so on back to the reference."""
    chain, e = [], c.best
    while e is not None and e not in chain:
        chain.append(e)
        before = [o for o in c.experiments[:e.index - 1] if o.verdict == "valid" and e.parent and o.station == e.parent]
        e = next((o for o in reversed(before) if o.run.n == e.run.n), before[-1] if before else None)
    return sorted(chain, key=lambda x: x.index)


def _decisive(c: Content) -> list[Block]:
    """The runs that made the best station (the best's lineage back to the reference); the runs whose quality
    evaluation failed under their own heading (never deployable, never part of the answer)."""
    out: list[Block] = [Heading(3, "The experiments that decided it")]
    made = made_best(c)
    vs = {r.run_id: r.vs_reference for by_n in c.tradeoffs.values() for rows in by_n.values() for r in rows}
    if not made:
        out.append(Table(("run",), ((Cell("none yet: no run made a best station"),),), "decisive"))
    else:
        out.append(_runs_table(made, vs, "decisive"))
    if c.quality_failed:
        out += [Heading(3, "Quality evaluation failed (never deployable)"),
                _runs_table(c.quality_failed, vs, "answer-quality-failed")]
    return out


def _runs_table(runs: list[Experiment], vs: dict[str, str | None], cls: str) -> Table:
    return Table(("run", "change", "N", "decision", "vs parent (same N)", "why"),
                 tuple((Cell(f"{e.index} ({e.run.id})"), Cell(e.change), Cell(str(e.run.n), "num"),
                        Cell(e.outcome.kind if e.outcome else "not judged", "decision"),
                        Cell(vs.get(e.run.id) or ""), Cell(e.outcome.text if e.outcome else "")) for e in runs),
                 cls, tuple(e.run.id for e in runs))


def _frontier(rep: Report) -> list[Block]:
    c = rep.content
    view = c.goal.spec.view()
    cols = view.columns()
    rows = [r for by_n in c.tradeoffs.values() for rs in by_n.values() for r in rs if r.frontier]
    out: list[Block] = [Heading(3, f"The frontier (valid, within the goal's SLO: {view.slo_words()}; nothing kept "
                                   "beats it)")]
    if rows:
        out.append(Table(("station", "N", "decision", f"whole {view.unit}", f"native {view.unit}")
                         + tuple(f.words for f in cols),
                         tuple((Cell(r.station or "", "station"), Cell(str(r.n), "num"), Cell(r.status),
                                Cell("" if r.whole is None else f"{r.whole:.2f}", "whole num"),
                                Cell("" if r.native is None else f"{r.native:.2f}", "native num"))
                               + tuple(Cell(_num(r.figures.get(f.key), f.digits), "num") for f in cols) for r in rows),
                         "answer-frontier", tuple(r.run_id for r in rows)))
    else:
        out.append(Table(("station",), ((Cell("none yet: no valid station within the SLO was kept"),),),
                         "answer-frontier"))
    if rep.frontiers and rep.frontiers[0] in rep.plots:
        p = rep.plots[rep.frontiers[0]]
        out.append(Image(p.name, p.title, p.caption, p.png))
    return out


def _num(v: float | None, digits: int) -> str:
    return "" if v is None else f"{v:.{digits}f}"

"""Assemble a report: the store's content plus the plots drawn from it (and from the run directories for
the queue and batch evidence the store only digests). What could not be drawn is named, with why.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent.report import plots, raw
from agent.report.content import (
    Content,
    Experiment,
    best_objectives,
    gather,
    objective_of,
)

if TYPE_CHECKING:  # the store and the goal view's figure are only annotated here
    from core.goalview import Figure
    from state.store import Store


@dataclass
class Report:
    content: Content
    plots: dict[str, plots.Plot] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # plot name -> why it is not drawn
    frontiers: tuple[str, ...] = ()  # the frontier plots' names: against the binding limit first, then each other


def build_report(store: Store, goal_id: str, base: str | Path | None = None) -> Report:
    """The report's content and plots; `base` is where relative run directories are (default: cwd)."""
    c = gather(store, goal_id, base)
    rep = Report(content=c)
    spec = c.goal.spec
    metric = f"{spec.view().objective_words} objective"
    drawn = frontier_plots(c)
    rep.plots.update({p.name: p for p in drawn})
    rep.frontiers = tuple(p.name for p in drawn)
    cand, parent = pair(c.experiments, c.best)
    if cand is None or parent is None:
        why = "no valid candidate with a valid run of its parent at the same N"
        rep.missing["queues"] = rep.missing["prefill_batches"] = why
    else:
        cl, pl = _label(cand), _label(parent)
        qc, qp = raw.queues(_dir(cand)), raw.queues(_dir(parent))
        if qc is None or qp is None:
            rep.missing["queues"] = f"engine samples (metrics.jsonl) not found for {_missing(cand, parent)}"
        else:
            rep.plots["queues"] = plots.queues(cl, qc, pl, qp)
        bc, bp = raw.batches(_dir(cand)), raw.batches(_dir(parent))
        if bc is None or bp is None or not (bc.tokens and bp.tokens):
            rep.missing["prefill_batches"] = "prefill batch records (prefill_batches.jsonl) not available for these runs"
        else:
            budget = cand.run.spec.get("knobs", {}).get("max_num_batched_tokens")
            rep.plots["prefill_batches"] = plots.batch_sizes(cl, bc, pl, bp, budget)
    own = [(e.run.id, sum(x.card_hours for x in c.experiments[:e.index]), objective_of(c.goal, e.summary)
            if e.verdict == "valid" else None) for e in c.experiments]
    rep.plots["progress"] = plots.progress(best_objectives(c), own, metric,
                                           frozenset(e.run.id for e in c.quality_failed))
    return rep


def frontier_axes(c: Content) -> tuple[Figure | None, ...]:
    """The latencies the frontier plots are drawn against (core.goalview `GoalView.axes`): the limit binding at the
    best run first, then each other limit; a goal without a limit, the latencies it reports; none: one plot saying
    so."""
    return c.goal.spec.view().axes(c.best.summary if c.best is not None else None) or (None,)


def frontier_name(fig: Figure | None) -> str:
    """A frontier plot's image name: `tput_<the latency's figure>` (tput_ttft_p99, tput_tpot_mean)."""
    return "tput_" + (fig.key.removesuffix("_ms") if fig is not None else "latency")


def frontier_plots(c: Content, first_only: bool = False, axis: str | None = None) -> list[plots.Plot]:
    """The goal's objective against each latency it limits, at the limit's own statistic (`frontier_axes`); only
    the first (the binding limit's), or only the one against the figure `axis` names."""
    view = c.goal.spec.view()
    rows = [r for by_n in c.tradeoffs.values() for rs in by_n.values() for r in rs]
    axes = frontier_axes(c)
    if axis is not None:
        axes = tuple(f for f in axes if f is not None and f.key == axis)
    return [plots.throughput_vs_latency(frontier_name(fig), rows, fig, view) for fig in (axes[:1] if first_only else axes)]


def frontier_plot(c: Content, axis: str | None = None) -> plots.Plot:
    """The report's first frontier plot (against the binding limit), or the one against `axis` (a figure key of
    `frontier_axes`): the dashboard's frontier panels (`GET /goals/G/frontier.png[?axis=KEY]`) draw exactly these."""
    got = frontier_plots(c, first_only=True, axis=axis)
    if not got:
        raise KeyError(axis)
    return got[0]


def pair(experiments: list[Experiment], best: Experiment | None) -> tuple[Experiment | None, Experiment | None]:
    """The candidate to show beside its parent: the best station's run if it was a change, else the latest
    valid change; its parent is the parent's latest valid run at the same N before it."""
    order = ([best] if best is not None else []) + list(reversed(experiments))
    for e in order:
        if e.card.get("change") and e.verdict == "valid" and (p := parent_run(experiments, e)) is not None:
            return e, p
    return None, None


def parent_run(experiments: list[Experiment], e: Experiment) -> Experiment | None:
    """The parent station's latest valid run at the same N before `e` (what its card was predicted against)."""
    found = None
    for o in experiments[:e.index - 1]:
        if o.verdict == "valid" and o.station == e.parent and o.run.n == e.run.n:
            found = o
    return found


def _label(e: Experiment) -> str:
    return f"run {e.index} ({e.change}, N={e.run.n})"


def _dir(e: Experiment) -> Path | None:
    return e.run_dir


def _missing(a: Experiment, b: Experiment) -> str:
    return ", ".join(f"run {e.index} (at {_dir(e) or 'no run directory'})" for e in (a, b) if raw.queues(_dir(e)) is None)

"""The report's plots (matplotlib, Agg canvas, no pyplot global state). Each function returns the PNG and
the exact series it drew, so a test can check a picture against the store rather than trust it.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from agent.report.raw import Batches, Queues
from agent.report.tradeoffs import TradeRow
from core.goalview import Figure as Axis
from core.goalview import GoalView

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


@dataclass(frozen=True)
class Plot:
    name: str
    title: str
    caption: str
    png: bytes
    series: dict[str, Any] = field(default_factory=dict)


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96)
    return buf.getvalue()


def frontier_2d(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both axes (higher y, lower x), sorted by x."""
    out = []
    for x, y in points:
        if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for x2, y2 in points):
            out.append((x, y))
    return sorted(set(out))


def throughput_vs_latency(name: str, rows: list[TradeRow], fig: Axis | None, view: GoalView) -> Plot:
    """The goal's objective, whole-window figure (filled) and native figure where valid (hollow), against one
    latency at the statistic the goal limits (`fig`, a goal view's axis), one colour per N; the valid frontier per
    N (whole figure, over the stations the loop kept that meet the SLO) and that limit as a line. The legend names
    the objective's window, the caption the goal's own SLO; before any valid run the plot says so instead of drawing
    empty axes, and a goal with no latency to draw against says that."""
    figure = Figure(figsize=(7.5, 4.6))
    ax = figure.add_subplot()
    points, frontiers = [], {}
    x_of = (lambda r: r.figures.get(fig.key)) if fig is not None else (lambda r: None)  # noqa: E731
    for i, n in enumerate(sorted({r.n for r in rows})):
        c = COLOURS[i % len(COLOURS)]
        at_n = [r for r in rows if r.n == n and x_of(r) is not None and r.whole is not None]
        for r in at_n:
            points.append({"run_id": r.run_id, "n": n, "x": x_of(r), "whole": r.whole, "native": r.native,
                           "slo_ok": r.slo_ok, "kept": r.kept, "quality_failed": r.quality_failed})
        own = lambda w: " (objective)" if w == view.window else ""  # noqa: E731
        ax.scatter([x_of(r) for r in at_n], [r.whole for r in at_n], color=c, label=f"whole window{own('whole')}, N={n}")
        nat = [r for r in at_n if r.native is not None]
        if nat:
            ax.scatter([x_of(r) for r in nat], [r.native for r in nat], facecolors="none", edgecolors=c,
                       label=f"native window{own('native')}, N={n}")
        bad = [r for r in at_n if r.quality_failed]
        if bad:
            ax.scatter([x_of(r) for r in bad], [r.whole for r in bad], marker="x", s=90, color="black",
                       label=f"quality evaluation failed (never deployable), N={n}")
        front = frontier_2d([(x_of(r), r.whole) for r in at_n if r.kept])
        frontiers[n] = front
        if front:
            ax.plot([p[0] for p in front], [p[1] for p in front], color=c, linestyle="--", linewidth=1, marker="s",
                    markersize=11, markerfacecolor="none", label=f"valid frontier, N={n}")
    label = fig.words.removesuffix(" ms") if fig is not None else "latency"
    slo = fig.limit_ms if fig is not None else None
    if slo is not None:
        ax.axvline(slo, color="black", linestyle=":", label=f"SLO {label} < {slo:g} ms")
    ax.set_xlabel(f"{label} (ms)")
    ax.set_ylabel(f"{view.objective_words.replace(' window', '')}\n(whole filled, native hollow)", fontsize=8)
    ax.grid(True, alpha=0.3)
    if points or slo is not None:
        ax.legend(fontsize=7, loc="best")
    if not points:
        ax.text(0.5, 0.5, "no valid result yet: each valid run appears here" if fig is not None else
                "this goal limits no latency and reports none: nothing to draw its objective against",
                transform=ax.transAxes, ha="center", va="center", fontsize=10, color="#555")
        ax.set_yticks([])
        if slo is None:
            ax.set_xticks([])
    title = f"{view.objective_words.split(' (')[0]} vs {label}"
    caption = (f"The goal's SLO: {view.slo_words()}. Each valid run: whole-window {view.objective_words.split(' (')[0]} "
               "(filled) and native figure where its window was valid (hollow); dashed: valid frontier per N over the "
               "stations kept (reference, best, trade-off) that meet the SLO"
               + ("; a black cross: its quality evaluation failed (never deployable)"
                  if any(p["quality_failed"] for p in points) else "")
               + (f"; dotted: the {label} limit." if slo is not None else f" ({label} is reported, not limited)."))
    ax.set_title(title)
    return Plot(name, title, caption, _png(figure), {"points": points, "frontier": frontiers, "slo": slo,
                                                     "x": fig.key if fig is not None else None})


def queues(cand_label: str, cand: Queues, parent_label: str, parent: Queues) -> Plot:
    """Prefill and decode queues over time for a candidate beside its parent (same scale)."""
    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, 2, sharey=True)
    series = {}
    for ax, (who, lab, q) in zip(axes, (("candidate", cand_label, cand), ("parent", parent_label, parent))):
        ax.plot(q.t, q.p_waiting, label="P waiting (all prefill instances)", color=COLOURS[1])
        ax.plot(q.t, q.d_waiting, label="D waiting", color=COLOURS[0])
        ax.plot(q.t, q.d_running, label="D running", color=COLOURS[2], alpha=0.6)
        ax.set_title(f"{who}: {lab}", fontsize=9)
        ax.set_xlabel("time since run start (s)")
        ax.grid(True, alpha=0.3)
        series[who] = {"label": lab, "t": list(q.t), "p_waiting": list(q.p_waiting), "d_waiting": list(q.d_waiting),
                       "d_running": list(q.d_running), "samples": dict(q.samples)}
    axes[0].set_ylabel("requests")
    axes[0].legend(fontsize=7, loc="upper right")
    title = "Prefill and decode queues: candidate beside its parent"
    caption = "Engine scrapes from each run's metrics.jsonl, summed over the instances of each role."
    return Plot("queues", title, caption, _png(fig), series)


def batch_sizes(cand_label: str, cand: Batches, parent_label: str, parent: Batches, budget: int | None) -> Plot:
    """Tokens per prefill batch, candidate beside parent: tail chunks (far below the token budget) show as
    a separate bar at the left, left of the dotted budget/8 line."""
    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, 2, sharey=True, sharex=True)
    top = max(cand.tokens + parent.tokens + [budget or 1])
    bins = [i * top / 32 for i in range(33)]
    tail_at = budget / 8 if budget else None
    series: dict[str, Any] = {"tail_below": tail_at}
    for ax, (who, lab, b, colour) in zip(axes, (("candidate", cand_label, cand, COLOURS[1]),
                                                ("parent", parent_label, parent, COLOURS[0]))):
        ax.hist(b.tokens, bins=bins, color=colour)
        tail = sum(1 for t in b.tokens if tail_at is not None and t < tail_at)
        if tail_at is not None:
            ax.axvline(tail_at, color="black", linestyle=":", label=f"tail: < budget/8 = {tail_at:g} tokens")
            ax.legend(fontsize=7, loc="upper center")
        ax.set_title(f"{who}: {lab}\n{len(b.tokens)} batches, {tail} tail", fontsize=9)
        ax.set_xlabel("tokens per prefill batch")
        ax.grid(True, alpha=0.3)
        series[who] = {"label": lab, "tokens": list(b.tokens), "batches": len(b.tokens), "tail": tail}
    axes[0].set_ylabel("batches")
    title = "Prefill batch size (tokens per batch)"
    caption = "From each run's prefill_batches.jsonl; the bar left of the dotted line counts the tail chunks."
    return Plot("prefill_batches", title, caption, _png(fig), series)


def progress(points: list[tuple[str, float, float | None, int | None]], runs: list[tuple[str, float, float | None]],
             metric: str, failed: frozenset[str] = frozenset()) -> Plot:
    """The deployable best's objective after each run against card-hours spent; each run's own figure as dots."""
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    xs = [p[1] for p in points if p[2] is not None]
    ys = [p[2] for p in points if p[2] is not None]
    ax.step(xs, ys, where="post", color=COLOURS[1], label="deployable best (objective)")
    ax.scatter(xs, ys, color=COLOURS[1], s=14)
    rx = [r[1] for r in runs if r[2] is not None]
    ry = [r[2] for r in runs if r[2] is not None]
    ax.scatter(rx, ry, color=COLOURS[0], marker="x", label="each valid run's own objective")
    bad = [r for r in runs if r[2] is not None and r[0] in failed]
    if bad:
        ax.scatter([r[1] for r in bad], [r[2] for r in bad], facecolors="none", edgecolors="black", s=120,
                   label="quality evaluation failed (never deployable)")
    ax.set_xlim(left=0)
    ax.set_xlabel("device time spent (card-hours)")
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    title = "Best figure vs device time spent"
    ax.set_title(title)
    caption = ("Step: the objective of the deployable best station after each run (empty until a best has a figure "
               "in the objective's window); crosses: each run's own objective figure; circled: its quality "
               "evaluation failed (never deployable).")
    series = {"run_ids": [p[0] for p in points], "card_hours": [p[1] for p in points], "best": [p[2] for p in points],
              "best_n": [p[3] for p in points], "runs": [list(r) for r in runs], "quality_failed": sorted(failed)}
    return Plot("progress", title, caption, _png(fig), series)

"""The trade-off table: valid runs per scenario and N, whole and native apart (native None where the window
was invalid), the frontier marked by the loop's own rule, and a percentage only against the parent at the
same N and window.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from agent.report.experiment import Experiment
from core.goalview import change
from core.summary import Summary
from state.goal import GoalSpec
from state.snapshots import Goal

KEPT = ("baseline", "new_best", "tradeoff", "quality_pending", "quality_passed")  # frontier candidates


@dataclass(frozen=True)
class TradeRow:
    """One valid station at one N: whole and native apart; native None where the window was invalid."""

    scenario: str
    n: int
    station: str | None
    run_id: str
    change: str
    status: str
    whole: float | None
    whole_s: float | None
    whole_n: int | None
    native: float | None
    native_s: float | None
    native_n: int | None
    native_reason: str | None
    ttft_mean: float | None
    ttft_p90: float | None
    tpot_mean: float | None
    e2e_mean: float | None
    slo_ok: bool
    kept: bool = False  # meets the SLO and the loop kept it (reference, best, trade-off, quality pending, not failed)
    frontier: bool = False
    vs_reference: str | None = None  # percentage against the reference at the same N and window only
    figures: dict[str, float | None] = field(default_factory=dict)  # the goal view's columns (limits, reported) by key
    quality_failed: bool = False  # its quality evaluation failed: never deployable, marked on every plot


def tradeoffs(goal: Goal, experiments: list[Experiment]) -> dict[str, dict[int, list[TradeRow]]]:
    """Valid runs per scenario and N (the latest per station), with the frontier marked per N."""
    spec = goal.spec
    latest: dict[tuple[str, int, str], tuple[TradeRow, Experiment | None]] = {}
    seen: dict[tuple[str, int, str], Experiment] = {}  # the latest valid run of each station so far
    for e in experiments:
        s = e.summary
        if e.verdict != "valid" or s is None:
            continue
        sc = e.run.spec.get("scenario", spec.scenario)
        ref = seen.get((sc, e.run.n, e.parent or "")) if e.card.get("change") else None
        key = (sc, e.run.n, e.station or e.run.id)
        latest[key] = (_row(sc, e, s, spec), ref)
        seen[key] = e
    out: dict[str, dict[int, list[TradeRow]]] = {}
    for (sc, n, _), (row, ref) in latest.items():
        out.setdefault(sc, {}).setdefault(n, []).append(_vs(row, ref, spec))
    for by_n in out.values():
        for n, rows in by_n.items():
            by_n[n] = sorted((_mark(r, rows) for r in rows), key=lambda r: -(r.whole or 0.0))
    return {sc: dict(sorted(v.items())) for sc, v in out.items()}


def _row(sc: str, e: Experiment, s: Summary, spec: GoalSpec) -> TradeRow:
    metric = spec.objective.metric
    w, nat = s.whole, s.native
    return TradeRow(
        scenario=sc, n=e.run.n, station=e.station, run_id=e.run.id, change=e.change,
        status=e.outcome.kind if e.outcome else "not judged",
        whole=getattr(w, metric) if w else None, whole_s=w.duration if w else None, whole_n=w.n_requests if w else None,
        native=getattr(nat, metric) if nat else None, native_s=nat.duration if nat else None,
        native_n=nat.n_requests if nat else None, native_reason=s.native_reason,
        ttft_mean=s.ttft_ms.mean, ttft_p90=s.ttft_ms.p90, tpot_mean=s.tpot_ms.mean, e2e_mean=s.e2e_ms.mean,
        slo_ok=not spec.constraints.violations(s), figures={f.key: f.read(s) for f in spec.view().columns()},
        kept=not spec.constraints.violations(s) and e.outcome is not None and e.outcome.kind in KEPT
        and not any(d.kind == "quality_failed" for d in e.decisions),  # never deployable: off the frontier
        quality_failed=any(d.kind == "quality_failed" for d in e.decisions))


def _vs(row: TradeRow, ref: Experiment | None, spec: GoalSpec) -> TradeRow:
    """The gain over the parent's latest valid run at the same N, in the objective's window when both have
    it, else the whole window for both; None without such a run (never a percentage across N)."""
    if ref is None or ref.summary is None or ref.run.n != row.n:
        return row
    for w in ([spec.objective.window, "whole"] if spec.objective.window == "native" else ["whole"]):
        a = row.native if w == "native" else row.whole
        rw = ref.summary.native if w == "native" else ref.summary.whole
        b = getattr(rw, spec.objective.metric) if rw is not None else None
        if a is not None and b:
            moved = change(a, b, spec.view().unit, tight=True)  # a near-zero parent: the two figures
            return replace(row, vs_reference=f"{moved} {w} vs parent at N={row.n}")
    return row


def _mark(row: TradeRow, rows: list[TradeRow]) -> TradeRow:
    """Frontier: kept by the loop, meets the SLO, and no other kept row at this N is as fast (whole) with every
    latency mean as low (the loop's own rule, agent.planner.judgement.frontier)."""
    keys = ("ttft_mean", "tpot_mean", "e2e_mean")

    def beats(b: TradeRow, a: TradeRow) -> bool:
        if any(getattr(x, k) is None for x in (a, b) for k in keys) or a.whole is None or b.whole is None:
            return False
        return (b.whole >= a.whole and all(getattr(b, k) <= getattr(a, k) for k in keys)
                and (b.whole > a.whole or any(getattr(b, k) < getattr(a, k) for k in keys)))

    return replace(row, frontier=row.kept and not any(beats(o, row) for o in rows if o is not row and o.kept))

"""Judge one finished run against its reference at the same N: pure, so every rule is testable alone.

Only a `valid` verdict can become a result. Figures are compared only at equal N and in the same window
(the objective's window when both runs have it, else the whole window for both); a percentage across
different N is never computed. A screen closes only clear negatives (no gain at all); any gain is confirmed. A confirm without the objective's window never becomes the best: it is
"window pending" until a run of that station (at a lower C) gives the objective's window. A run that loses on the objective but has lower TTFT, TPOT and E2E is a
trade-off (the field report's rule: trade-offs are results), kept on the frontier rather than closed
as a negative.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from agent.planner.candidates import CandidateCard
from agent.planner.history import Decision, Figures, History, Outcome
from core.goalview import UNITS, change

LATENCY_WIN = 0.05  # lower on every latency mean, and at least 5 % lower on one, is a latency win
CLEAR_LOSS = 0.02  # beyond run-to-run noise (~1-2 %)
TRADEOFF_MAX_LOSS = 0.25  # a latency win is a trade-off only while the objective loses less than 25 % (a judgement)


class Comparison(BaseModel):
    model_config = ConfigDict(frozen=True)
    window: str | None  # "native" | "whole" | None (no common window)
    gain: float | None  # relative, candidate vs reference, same N and window
    latency_win: bool


def latency_wins(cand: Figures, ref: Figures) -> bool:
    """Lower TTFT, TPOT and E2E means (none higher), at least one of them clearly (>= 5 %) lower.

    The field report's C90 is such a point: TTFT and E2E far lower, TPOT a little lower.
    """
    lat = [(cand.ttft_mean, ref.ttft_mean), (cand.tpot_mean, ref.tpot_mean), (cand.e2e_mean, ref.e2e_mean)]
    if any(a is None or not b for a, b in lat):
        return False
    return all(a < b for a, b in lat) and any(a <= b * (1 - LATENCY_WIN) for a, b in lat)  # type: ignore[operator]


def compare(cand: Figures, ref: Figures, window: str) -> Comparison:
    if cand.n != ref.n:
        raise ValueError(f"refusing to compare N={cand.n} with N={ref.n} as a percentage")
    used, gain = None, None
    order = [window, "whole"] if window == "native" else ["whole"]
    for w in order:
        a, b = getattr(cand, w), getattr(ref, w)
        if a is not None and b is not None and b > 0:
            used, gain = w, a / b - 1.0
            break
    latency_win = latency_wins(cand, ref)
    return Comparison(window=used, gain=gain, latency_win=latency_win)


def decide(card: CandidateCard, verdict: str, figures: Figures | None, history: History) -> tuple[Decision, str]:
    """The decision for one finished run of `card` (screen, confirm or baseline)."""
    if verdict in ("orchestration_fault", "collection_fault"):
        return "fault", f"{verdict}: a tooling fault, not a result"
    if verdict != "valid":
        return "invalid", f"{verdict}: broke the scenario contract, not a result"
    assert figures is not None
    if card.stage == "baseline":
        return "reference", f"reference at N={card.n}"
    goal = history.goal
    if figures.slo_violations:
        return "negative", "breaks the SLO: " + "; ".join(figures.slo_violations)
    ref = history.reference(card.parent_knobs, card.n)
    broke = card.parent_knobs_hash != history.best_knobs_hash and any(
        o.verdict == "valid" and o.figures is not None and o.card.knobs_hash == card.parent_knobs_hash
        and o.figures.slo_violations for o in history.outcomes)
    if broke:
        # the parent broke the SLO (a load move that crossed the TPOT limit): it is no reference; judge against
        # the best station at this N, as a recovered window is
        anchor = history.reference(history.best_knobs, card.n)
        if anchor is None or anchor.figures is None:
            return "fault", f"no valid reference of the best station at N={card.n}: cannot judge"
        ref = anchor
    if ref is None or ref.figures is None:
        return "fault", f"no valid reference of the parent at N={card.n}: cannot judge"
    window = goal.objective.window
    ref_figs, against = ref.figures, ("the best station (the parent breaks the SLO)" if broke else "parent")
    if card.stage == "confirm" and window == "native" and figures.native is not None and ref_figs.native is None:
        # the parent's gain was confirmed on the whole window only; this run recovers the objective's window,
        # so it is judged there against the best station (the last one with a native figure at this N)
        anchor = history.reference(history.best_knobs, card.n)
        if anchor is not None and anchor.figures is not None and anchor.figures.native is not None:
            ref_figs, against = anchor.figures, "the best station (the parent has no native window)"
    cmp = compare(figures, ref_figs, window)
    if cmp.gain is None:
        return "negative", "no common window with the reference"
    # a percentage of a near-zero parent (goodput 0.07 -> 6.97) says nothing: the two figures instead
    moved = change(getattr(figures, cmp.window), getattr(ref_figs, cmp.window), UNITS.get(goal.objective.metric, ""),
                   tight=True)
    pct = f"{moved} {cmp.window} vs {against} at N={card.n}"
    if ref_figs.slo_violations:
        # the reference breaks the SLO and this run meets it: feasible beats infeasible, whatever the throughput
        broken = "; ".join(ref_figs.slo_violations)
        if card.stage == "screen":
            return "promising", f"screen {pct}: meets the SLO the reference breaks ({broken}): confirm at N={goal.protocol.confirm_n}"
        if window == "native" and figures.native is None:
            return "window_pending", (f"confirmed {pct}, meets the SLO the reference breaks, but no valid native "
                                      f"window at N={card.n}: not the best until a run of it gives one")
        if card.quality_risk:
            return "quality_pending", f"confirmed {pct}, meets the SLO the reference breaks; quality pending"
        return "new_best", f"confirmed {pct}: meets the SLO the reference breaks ({broken}): new best station"
    min_gain = goal.stop.min_gain_pct / 100.0
    if card.stage == "screen" and 0 < cmp.gain < min_gain:
        # a short run's whole window is mostly ramp and drain: a small gain there is not a clear negative
        return "promising", f"screen {pct}: positive but inside screen noise, the confirm at N={goal.protocol.confirm_n} decides"
    if cmp.gain >= min_gain:
        if card.stage == "screen":
            return "promising", f"screen {pct}: confirm at N={goal.protocol.confirm_n}"
        if window == "native" and figures.native is None:
            return "window_pending", (f"confirmed {pct}, but no valid native window at N={card.n} (the objective's "
                                      "window): not the best until a run of it gives one")
        if card.quality_risk:
            return "quality_pending", f"confirmed {pct}; performance-positive, quality pending"
        return "new_best", f"confirmed {pct}: new best station"
    if cmp.latency_win and cmp.gain > -TRADEOFF_MAX_LOSS:
        if card.stage == "screen":
            return "promising", f"screen {pct} with lower TTFT, TPOT and E2E: confirm as a trade-off"
        return "tradeoff", f"confirmed {pct} with lower TTFT, TPOT and E2E: a trade-off on the frontier"
    return "negative", f"{card.stage} {pct}" + (" (a clear loss)" if cmp.gain <= -CLEAR_LOSS else " (no gain beyond noise)")


def frontier(outcomes: list[Outcome], n: int) -> list[dict[str, Any]]:
    """Valid, SLO-meeting stations at one N that no other beats on throughput and every latency mean.

    Whole and native stay separate columns; native is None where the window was invalid.
    """
    rows: dict[str, Outcome] = {}
    for o in outcomes:
        if o.verdict == "valid" and o.figures and o.card.n == n and not o.figures.slo_violations:
            if o.decision in ("reference", "new_best", "tradeoff", "quality_pending"):
                rows[o.card.knobs_hash] = o
    def dominated(a: Figures, b: Figures) -> bool:
        keys = ("ttft_mean", "tpot_mean", "e2e_mean")
        if a.whole is None or b.whole is None or any(getattr(x, k) is None for x in (a, b) for k in keys):
            return False
        return (b.whole >= a.whole and all(getattr(b, k) <= getattr(a, k) for k in keys)
                and (b.whole > a.whole or any(getattr(b, k) < getattr(a, k) for k in keys)))
    out = []
    for h, o in rows.items():
        if any(dominated(o.figures, p.figures) for k, p in rows.items() if k != h):  # type: ignore[arg-type]
            continue
        f = o.figures
        assert f is not None
        out.append({"knobs_hash": h, "knobs": o.card.knobs, "n": n, "whole": f.whole, "whole_s": f.whole_s,
                    "native": f.native, "native_s": f.native_s, "native_n": f.native_n,
                    "ttft_mean_ms": f.ttft_mean, "tpot_mean_ms": f.tpot_mean, "e2e_mean_ms": f.e2e_mean,
                    "status": "quality pending" if o.decision == "quality_pending" else o.decision,
                    "run_id": o.run_id})
    return sorted(out, key=lambda r: -(r["whole"] or 0.0))

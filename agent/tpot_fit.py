"""A local latency model along the load: mean TPOT against the decode batch, fitted from the runs already made.

A decode step costs a fixed part (weights, communication, scheduling) plus a part per sequence in the batch, so
near a station mean TPOT is close to a line in the decode batch (the simulator's own step model is of that form,
and so is a real engine's, until the KV cache or the batch's compute saturates). Every valid run of the goal that
differs from the station only in its load (concurrency, decode batch limit, arrival rate) is a point on that line:
(mean running decode batch per instance, mean TPOT). With two distinct batches the line says how far the load can
still move before TPOT crosses its limit: the planner raises the load by the step the line allows, not by a
fixed step, and stops raising it where the line says the limit is crossed (docs/protocol.md § 2).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.history import History
from agent.rules.base import num

LOAD_KNOBS = ("concurrency", "max_num_seqs", "request_rate")
MARGIN = 0.0  # below the limit by this share, less the fit's largest residual (the optimum sits at the limit)
MIN_SPREAD = 2.0  # the batches must differ by this many sequences for a slope


@dataclass(frozen=True)
class Line:
    a: float  # ms at an empty batch
    b: float  # ms per sequence in the batch
    points: int
    residual: float  # largest |TPOT - line| over the points, ms

    def at(self, batch: float) -> float:
        return self.a + self.b * batch


def tpot_line(history: History, knobs: dict[str, Any], n: int) -> Line | None:
    """The TPOT line through the valid runs of N = n that share every non-load knob with `knobs` (None: < 2
    distinct batches, or a slope that does not rise with the batch)."""
    base = {k: v for k, v in knobs.items() if k not in LOAD_KNOBS}
    xs, ys = [], []
    for o in history.outcomes:
        if o.verdict != "valid" or o.summary is None or o.summary.tpot_ms.mean is None or o.card.n != n:
            continue
        if {k: v for k, v in o.card.knobs.items() if k not in LOAD_KNOBS} != base:
            continue
        x = num(o.evidence or {}, "decode_running_mean")
        if x is None or x <= 0:
            continue
        xs.append(x)
        ys.append(float(o.summary.tpot_ms.mean))
    if len(xs) < 2 or max(xs) - min(xs) < MIN_SPREAD:
        return None
    b, a = np.polyfit(np.array(xs), np.array(ys), 1)
    if not np.isfinite(b) or b <= 0:
        return None
    res = max(abs(y - (a + b * x)) for x, y in zip(xs, ys))
    return Line(a=float(a), b=float(b), points=len(xs), residual=float(res))


def _cap(knobs: dict[str, Any], inst: float) -> float | None:
    """The decode batch per instance the knobs allow: the batch limit, or the client's cap spread over instances."""
    c, seqs = knobs.get("concurrency"), knobs.get("max_num_seqs")
    caps = [float(v) for v in (seqs, c / inst if isinstance(c, (int, float)) else None) if isinstance(v, (int, float))]
    return min(caps) if caps else None


def predicted_tpot(history: History, target: dict[str, Any],
                   limit_ms: float | None) -> tuple[float, bool, str] | None:
    """Mean TPOT the line (at the N of the best station's latest run) predicts at `target`, a load change of
    the best station; whether it stays under the limit less the margin; both in words. None: no line. The best
    station's batch fill (mean running over its cap) is assumed to hold at the target's cap."""
    ref = history.latest_valid(history.best_knobs)
    line = tpot_line(history, history.best_knobs, ref.card.n) if ref is not None else None
    if line is None or ref is None or limit_ms is None:
        return None
    ev = ref.evidence or {}
    inst = num(ev, "decode_instances") or 1.0
    run, cap0, cap1 = num(ev, "decode_running_mean"), _cap(history.best_knobs, inst), _cap(target, inst)
    if run is None or not cap0 or not cap1:
        return None
    batch = run * cap1 / cap0
    tpot = line.at(batch)
    bound = limit_ms * (1 - MARGIN) - line.residual
    ok = "under" if tpot <= bound else "over"
    return tpot, ok == "under", (
        f"the TPOT line over {line.points} run(s) ({line.a:.1f} + {line.b:.4f} ms per sequence) predicts "
        f"{tpot:.1f} ms at a decode batch of ~{batch:.0f}: {ok} the {limit_ms:g} ms limit less its margin ({bound:.1f} ms)")


def fits(history: History, target: dict[str, Any], limit_ms: float | None) -> str | None:
    """The line's words when it predicts `target` under the TPOT limit with its margin; None otherwise."""
    got = predicted_tpot(history, target, limit_ms)
    return got[2] if got is not None and got[1] else None

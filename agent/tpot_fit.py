"""A local latency model along the load: mean TPOT against the decode batch, fitted from the runs already made.

A decode step costs a fixed part (weights, communication, scheduling) plus a part per sequence in the batch, so
near a station mean TPOT is close to a line in the decode batch (the simulator's own step model is of that form,
and so is a real engine's, until the KV cache or the batch's compute saturates). Every valid run of the goal that
differs from the station only in its load (concurrency, decode batch limit, arrival rate) is a point on that line:
(mean running decode batch per instance, mean TPOT). With two distinct batches the line says how far the load can
still move before TPOT crosses its limit. The optimum of a latency-limited goal sits at the limit, so the line
gives a step a chance (its largest residual, at least 1 % of the limit, as the spread) rather than a hard cut,
and the step runs when that chance is at least a quarter (docs/protocol.md § 2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from typing import TYPE_CHECKING

import numpy as np

from agent.rules.base import num

if TYPE_CHECKING:  # the rules import this module, and History imports the rules' move table
    from agent.history import History

LOAD_KNOBS = ("concurrency", "max_num_seqs", "request_rate")
SIGMA_FLOOR = 0.01  # the line's uncertainty: its largest residual, at least this share of the limit
MIN_CHANCE = 0.25  # a step runs when the line gives it at least this chance of staying under the limit
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
    """The TPOT line through the valid runs of N = n (a run's mean TPOT and mean batch both depend on its ramp
    and drain, so only runs of one N lie on one line) that share every non-load knob with `knobs`, one point per
    load station (repeats averaged). None: < 2 stations whose batches differ by MIN_SPREAD, or a slope that does
    not rise with the batch."""
    base = {k: v for k, v in knobs.items() if k not in LOAD_KNOBS}
    pts: dict[str, list[tuple[float, float]]] = {}
    for o in history.outcomes:
        if o.verdict != "valid" or o.summary is None or o.summary.tpot_ms.mean is None or o.card.n != n:
            continue
        if {k: v for k, v in o.card.knobs.items() if k not in LOAD_KNOBS} != base:
            continue
        x = num(o.evidence or {}, "decode_running_mean")
        if x is None or x <= 0:
            continue
        pts.setdefault(o.card.knobs_hash, []).append((x, float(o.summary.tpot_ms.mean)))
    xs = [sum(x for x, _ in p) / len(p) for p in pts.values()]
    ys = [sum(y for _, y in p) / len(p) for p in pts.values()]
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
    """Mean TPOT the line predicts at `target`, a load change of
    the best station; whether its chance of staying under the limit is at least MIN_CHANCE; both in words. None: no line. The best
    station's batch fill (mean running over its cap) is assumed to hold at the target's cap."""
    got = _on_line(history, target, limit_ms)
    return None if got is None else (got[0], got[1] >= MIN_CHANCE, got[2])


def _on_line(history: History, target: dict[str, Any], limit_ms: float | None) -> tuple[float, float, str] | None:
    """predicted_tpot's figures: the TPOT at `target`, its chance under the limit, the words."""
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
    sigma = max(line.residual, SIGMA_FLOOR * limit_ms)
    chance = 0.5 * (1.0 + math.erf((limit_ms - tpot) / (sigma * math.sqrt(2.0))))
    return tpot, chance, (
        f"the TPOT line over {line.points} run(s) ({line.a:.1f} + {line.b:.4f} ms per sequence) predicts "
        f"{tpot:.1f} ± {sigma:.1f} ms at a decode batch of ~{batch:.0f}: a {chance:.0%} chance under the "
        f"{limit_ms:g} ms limit")


def load_chance(history: History, target: dict[str, Any], limit_ms: float | None) -> tuple[float, str] | None:
    """The chance that `target`, a load raise of the best station, keeps mean TPOT under the limit, in words. With
    a line (two batches measured), the line's. From the best station's run alone: TPOT = a + b·batch with a, b ≥ 0
    rises at least not at all and at most in proportion to the batch, so at a batch g times the current one it lies
    in [T, g·T]; knowing nothing of the fixed share a / T, every point of that range is as likely, and the chance is
    the share of it under the limit. None: no figures, no limit, or a target whose decode batch cannot grow."""
    got = _on_line(history, target, limit_ms)
    if got is not None:
        return got[1], got[2]
    ref = history.latest_valid(history.best_knobs)
    s = ref.summary if ref is not None else None
    if limit_ms is None or s is None or not s.tpot_ms.mean:
        return None
    ev = ref.evidence or {}  # type: ignore[union-attr]
    inst = num(ev, "decode_instances") or 1.0
    cap0, cap1 = _cap(history.best_knobs, inst), _cap(target, inst)
    if not cap0 or not cap1 or cap1 <= cap0:
        return None
    g, t = cap1 / cap0, float(s.tpot_ms.mean)
    waiting, running = num(ev, "decode_waiting_mean"), num(ev, "decode_running_total_mean")
    if target.get("concurrency") == history.best_knobs.get("concurrency") and waiting is not None and running:
        g = min(g, 1.0 + waiting / running)  # the same load: a wider batch admits only what waits for decode
    if g <= 1.0:
        return None
    chance = min(1.0, max(0.0, (limit_ms - t) / (t * (g - 1.0))))
    return chance, (f"mean TPOT {t:.1f} ms of a {limit_ms:g} ms limit: a decode batch up to x{g:.2f} puts it between "
                    f"{t:.1f} and {g * t:.1f} ms (no fixed cost to all fixed cost), {chance:.0%} of that range under "
                    f"the limit")


def fits(history: History, target: dict[str, Any], limit_ms: float | None) -> str | None:
    """The line's words when it gives `target` at least MIN_CHANCE of meeting the TPOT limit; None otherwise."""
    got = predicted_tpot(history, target, limit_ms)
    return got[2] if got is not None and got[1] else None


def sized_down(knob: str, cur: Any, values: list[Any], history: History, headroom: float | None,
               limit_ms: float | None) -> tuple[Any, str] | None:
    """While the best station breaks its TPOT limit: the listed value a load-lowering move (C, max_num_seqs)
    jumps to, when that is beyond the next step down. TPOT = a + b·batch with a ≥ 0 falls at most in proportion
    to the batch, so the decode batch (its peak, over all decode instances for C, per instance for max_num_seqs)
    must fall at least to limit / TPOT of itself: a cap above that cannot get feasible. Once a TPOT line is known (two batches measured) it sizes the cut instead: the batch where
    the line meets the limit less its spread. None: no jump (feasible, no figures, or the next step is already that far)."""
    if knob not in ("concurrency", "max_num_seqs") or headroom is None or headroom >= 0 or limit_ms is None \
            or not isinstance(cur, (int, float)):
        return None
    ref = history.latest_valid(history.best_knobs)
    s = ref.summary if ref is not None else None
    if s is None or not s.tpot_ms.mean:
        return None
    ev = ref.evidence or {}  # type: ignore[union-attr]
    now = num(ev, "decode_running_max")  # TPOT follows the decode batch; C must cut into all of it
    if knob == "concurrency" and now is not None:
        now *= num(ev, "decode_instances") or 1.0
    if not now:
        return None
    bound, how = now * limit_ms / s.tpot_ms.mean, "TPOT falls at most in proportion"
    line, run = tpot_line(history, history.best_knobs, ref.card.n), num(ev, "decode_running_mean")  # type: ignore[union-attr]
    if line is not None and run:  # the line through the runs made: the batch at the limit less its spread
        batch = (limit_ms - max(line.residual, SIGMA_FLOOR * limit_ms) - line.a) / line.b
        bound, how = now * max(batch, 0.0) / run, f"the TPOT line over {line.points} run(s) reaches it at a batch of ~{batch:.0f}"
    downs = sorted(v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v < cur)
    if len(downs) < 2:
        return None
    target = max((v for v in downs if v <= bound), default=downs[0])
    if target == downs[-1]:
        return None
    what = "running in decode" if knob == "concurrency" else "running per decode instance"
    return target, (f"{now:.0f} {what} at a mean TPOT of {s.tpot_ms.mean:.1f} ms; {how}, so under the "
                    f"{limit_ms:g} ms limit needs at most ~{bound:.0f}; {knob} {target} is the largest listed value there")


def sized_rate(cur: Any, values: list[Any], history: History, limit_ms: float | None) -> tuple[Any, str] | None:
    """Where the arrival rate binds: the listed rate a raise jumps to, beyond the next step. By Little's law the
    decode batch is r × (decode time per request) = k·r·TPOT (k read off the best station's run), and TPOT is
    the line a + b·batch, so batch = k·r·a / (1 - k·r·b): the largest listed rate whose batch stays under the
    station's batch cap and whose TPOT has an even chance under the limit. Needs the line (two batches)."""
    if not isinstance(cur, (int, float)) or limit_ms is None:
        return None
    ref = history.latest_valid(history.best_knobs)
    if ref is None or ref.summary is None or not ref.summary.tpot_ms.mean:
        return None
    ev = ref.evidence or {}
    line, run = tpot_line(history, history.best_knobs, ref.card.n), num(ev, "decode_running_mean")
    inst = num(ev, "decode_instances") or 1.0
    cap = _cap(history.best_knobs, inst)
    if line is None or not run or not cap:
        return None
    k = run / (cur * ref.summary.tpot_ms.mean)
    sigma = max(line.residual, SIGMA_FLOOR * limit_ms)
    ups = sorted(v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v > cur)
    best: tuple[Any, float, float] | None = None
    for r in ups:
        left = 1.0 - k * r * line.b
        batch = k * r * line.a / left if left > 0 else math.inf
        tpot = line.at(batch)
        if batch > cap or 0.5 * (1.0 + math.erf((limit_ms - tpot) / (sigma * math.sqrt(2.0)))) < 0.5:
            break
        best = (r, batch, tpot)
    if best is None or len(ups) < 2 or best[0] == ups[0]:
        return None
    r, batch, tpot = best
    return r, (f"the rate binds; by Little's law and the TPOT line over {line.points} run(s), r={r:g} runs a decode "
               f"batch of ~{batch:.0f} at ~{tpot:.1f} ms, under the {limit_ms:g} ms limit: the largest listed rate there")

"""A local latency model along the load: a decode-side latency figure (the goal's decode-side limit's: mean TPOT,
a TPOT or ITL tail, E2E; core/goalview.py) against the decode batch, fitted from the runs already made.

A decode step costs a fixed part (weights, communication, scheduling) plus a part per sequence in the batch, so
near a station its TPOT (mean or tail: each token waits one step) is close to a line in the decode batch (the simulator's own step model is of that form,
and so is a real engine's, until the KV cache or the batch's compute saturates). Every valid run of the goal that
differs from the station only in its load (concurrency, decode batch limit, arrival rate) is a point on that line:
(mean running decode batch per instance, the limit's figure). With two distinct batches the line says how far the load can
still move before TPOT crosses its limit. The optimum of a latency-limited goal sits at the limit, so the line
gives a step a chance (its largest residual, at least 1 % of the limit, as the spread) rather than a hard cut,
and the step runs when that chance is at least a quarter (docs/protocol.md § 2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.planner.history import History, Outcome
from core.goalview import Limit
from core.knobs import ARRIVAL_RATE, BATCH_CAP, CLIENT_CAP, by_role, named, role_of


LOAD_KNOBS = (CLIENT_CAP, BATCH_CAP, ARRIVAL_RATE)  # the roles of the load knobs: a line's points may differ in these
SIGMA_FLOOR = 0.01  # the line's uncertainty: its largest residual, at least this share of the limit
MIN_CHANCE = 0.25  # a step runs when the line gives it at least this chance of staying under the limit
MIN_SPREAD = 2.0  # the batches must differ by this many sequences for a slope
CDF_HALF = 0.5  # the normal CDF: Φ(z) = ½ (1 + erf(z / √2)) (structural)
EVEN_CHANCE = 0.5  # a sized jump goes up to the last value the line keeps an even chance under the limit (judgement)


@dataclass(frozen=True)
class Line:
    a: float  # ms at an empty batch
    b: float  # ms per sequence in the batch
    points: int
    residual: float  # largest |TPOT - line| over the points, ms

    def at(self, batch: float) -> float:
        return self.a + self.b * batch

    def spread(self, limit_ms: float) -> float:
        """The line's uncertainty against a limit: its largest residual, at least SIGMA_FLOOR of the limit."""
        return max(self.residual, SIGMA_FLOOR * limit_ms)


def line_limit(history: History) -> Limit | None:
    """The limit a line along the decode batch sizes moves by: the goal's binding limit at the best station's latest
    run when it is on the decode side (mean TPOT, a TPOT or ITL tail); None when a prefill-side or E2E limit binds
    there (a decode-batch line says nothing of it) or the goal has no latency limit."""
    ref = history.latest_valid(history.best_knobs)
    bound = history.goal.view().binding(ref.summary if ref is not None else None)
    return bound if bound is not None and bound.side == "decode" else None


def tpot_line(history: History, knobs: dict[str, Any], n: int, limit: Limit | None) -> Line | None:
    """The line of the limit's figure (its metric at its statistic) through the valid runs of N = n (a run's mean TPOT and mean batch both depend on its ramp
    and drain, so only runs of one N lie on one line) that share every non-load knob with `knobs`, one point per
    load station (repeats averaged). None: < 2 stations whose batches differ by MIN_SPREAD, or a slope that does
    not rise with the batch, or no limit."""
    if limit is None:
        return None
    base = {k: v for k, v in knobs.items() if role_of(k) not in LOAD_KNOBS}
    pts: dict[str, list[tuple[float, float]]] = {}
    for o in history.outcomes:
        y = limit.figure(o.summary)
        if o.verdict != "valid" or y is None or o.card.n != n:
            continue
        if {k: v for k, v in o.card.knobs.items() if role_of(k) not in LOAD_KNOBS} != base:
            continue
        x = o.evidence.decode_running_mean
        if x is None or x <= 0:
            continue
        pts.setdefault(o.card.knobs_hash, []).append((x, y))
    xs = [sum(x for x, _ in p) / len(p) for p in pts.values()]
    ys = [sum(y for _, y in p) / len(p) for p in pts.values()]
    if len(xs) < 2 or max(xs) - min(xs) < MIN_SPREAD:
        return None
    b, a = np.polyfit(np.array(xs), np.array(ys), 1)
    if not np.isfinite(b) or b <= 0:
        return None
    res = max(abs(y - (a + b * x)) for x, y in zip(xs, ys))
    return Line(a=float(a), b=float(b), points=len(xs), residual=float(res))


def batch_at(run: float, cap0: float, cap1: float, n: int | None, inst: float) -> float:
    """The mean running decode batch per instance at a cap of `cap1`, from a run of n requests that ran a mean
    of `run` at a cap of `cap0`. A closed-loop run of n requests through m slots is not full all along: by
    Little's law its mean batch is n·D / T (D: a request's decode time, T: the run's length), and T/D is n/m
    waves of requests plus the ramp and drain, which take a share δ of D that the slots' count hardly moves (a
    first wave admitted at once, a last one draining from m to 0). δ is read off the measured run
    (n/run - n/m0 per instance); at cap1 the batch is then n / (n/m1 + δ). With n far above the cap this is the
    run's fill held (run ∝ cap); near n it is well under it (a cap of n runs the whole run in one wave and its
    drain, not at n)."""
    nn = (n or 0) / max(inst, 1.0)
    if run <= 0 or cap0 <= 0 or cap1 <= 0 or nn <= 0:
        return run * cap1 / cap0 if cap0 > 0 else run
    if run >= min(cap0, nn):  # held full by its queue: no ramp to carry, and never more than the run's requests
        return run * min(cap1, nn) / min(cap0, nn)
    delta = max(0.0, nn / run - nn / min(cap0, nn))
    return nn / (nn / min(cap1, nn) + delta)


def decode_cap(knobs: dict[str, Any], inst: float) -> float | None:
    """The decode batch per instance the knobs allow: the batch limit, or the client's cap spread over instances."""
    c, seqs = by_role(knobs, CLIENT_CAP), by_role(knobs, BATCH_CAP)
    caps = [float(v) for v in (seqs, c / inst if isinstance(c, (int, float)) else None) if isinstance(v, (int, float))]
    return min(caps) if caps else None


def predicted_tpot(history: History, target: dict[str, Any],
                   limit: Limit | None) -> tuple[float, bool, str] | None:
    """Mean TPOT the line predicts at `target`, a load change of
    the best station; whether its chance of staying under the limit is at least MIN_CHANCE; both in words. None: no line. The best
    station's mean batch is carried to the target's cap by the closed-loop run model (batch_at)."""
    got = _on_line(history, target, limit)
    return None if got is None else (got[0], got[1] >= MIN_CHANCE, got[2])


def _on_line(history: History, target: dict[str, Any], limit: Limit | None) -> tuple[float, float, str] | None:
    """predicted_tpot's figures: the limit's figure at `target`, its chance under the limit, the words."""
    ref = history.latest_valid(history.best_knobs)
    line = tpot_line(history, history.best_knobs, ref.card.n, limit) if ref is not None else None
    if line is None or ref is None or limit is None:
        return None
    limit_ms = limit.limit_ms
    ev = ref.evidence
    inst = ev.decode_instances or 1.0
    run, cap0, cap1 = ev.decode_running_mean, decode_cap(history.best_knobs, inst), decode_cap(target, inst)
    if run is None or not cap0 or not cap1:
        return None
    batch = batch_at(run, cap0, cap1, ref.card.n, inst)
    tpot = line.at(batch)
    sigma = line.spread(limit_ms)
    chance = chance_under(limit_ms, tpot, sigma)
    return tpot, chance, (
        f"the {limit.words} line over {line.points} run(s) ({line.a:.1f} + {line.b:.4f} ms per sequence) predicts "
        f"{tpot:.1f} ± {sigma:.1f} ms at a decode batch of ~{batch:.0f}: a {chance:.0%} chance under the "
        f"{limit_ms:g} ms limit")


def load_chance(history: History, target: dict[str, Any], limit: Limit | None) -> tuple[float, str] | None:
    """The chance that `target`, a load raise of the best station, keeps the decode-side limit's figure under the
    limit, in words. With
    a line (two batches measured), the line's. From the best station's run alone: TPOT = a + b·batch with a, b ≥ 0
    rises at least not at all and at most in proportion to the batch, so at a batch g times the current one it lies
    in [T, g·T]; knowing nothing of the fixed share a / T, every point of that range is as likely, and the chance is
    the share of it under the limit. None: no figures, no limit, or a target whose decode batch cannot grow."""
    got = _on_line(history, target, limit)
    if got is not None:
        return got[1], got[2]
    ref = history.latest_valid(history.best_knobs)
    s = ref.summary if ref is not None else None
    now = limit.figure(s) if limit is not None else None
    if limit is None or not now:
        return None
    limit_ms = limit.limit_ms
    ev = ref.evidence  # type: ignore[union-attr]
    inst = ev.decode_instances or 1.0
    cap0, cap1 = decode_cap(history.best_knobs, inst), decode_cap(target, inst)
    if not cap0 or not cap1 or cap1 <= cap0:
        return None
    g, t = cap1 / cap0, now
    waiting, running = ev.decode_waiting_mean, ev.decode_running_total_mean
    if by_role(target, CLIENT_CAP) == by_role(history.best_knobs, CLIENT_CAP) and waiting is not None and running:
        g = min(g, 1.0 + waiting / running)  # the same load: a wider batch admits only what waits for decode
    if g <= 1.0:
        return None
    chance = min(1.0, max(0.0, (limit_ms - t) / (t * (g - 1.0))))
    return chance, (f"{limit.words} {t:.1f} ms of a {limit_ms:g} ms limit: a decode batch up to x{g:.2f} puts it between "
                    f"{t:.1f} and {g * t:.1f} ms (no fixed cost to all fixed cost), {chance:.0%} of that range under "
                    f"the limit")


def fits(history: History, target: dict[str, Any], limit: Limit | None) -> str | None:
    """The line's words when it gives `target` at least MIN_CHANCE of meeting the limit; None otherwise."""
    got = predicted_tpot(history, target, limit)
    return got[2] if got is not None and got[1] else None


def sized_down(knob: str, cur: Any, values: list[Any], history: History, headroom: float | None,
               limit: Limit | None) -> tuple[Any, str] | None:
    """While the best station breaks its decode-side limit (`limit`: mean TPOT, a TPOT tail ...): the listed value a load-lowering move (C, max_num_seqs)
    jumps to, when that is beyond the next step down. TPOT = a + b·batch with a ≥ 0 falls at most in proportion
    to the batch, so the decode batch (its peak, over all decode instances for C, per instance for max_num_seqs)
    must fall at least to limit / TPOT of itself: a cap above that cannot get feasible. Once a TPOT line is known (two batches measured) it sizes the cut instead: the batch where
    the line meets the limit less its spread. None: no jump (feasible, no figures, or the next step is already that far)."""
    role = role_of(knob)
    if role not in (CLIENT_CAP, BATCH_CAP) or headroom is None or headroom >= 0 or limit is None \
            or not isinstance(cur, (int, float)):
        return None
    ref = history.latest_valid(history.best_knobs)
    got = limit.figure(ref.summary if ref is not None else None)
    if not got:
        return None
    limit_ms = limit.limit_ms
    ev = ref.evidence  # type: ignore[union-attr]
    now = ev.decode_running_max  # TPOT follows the decode batch; C must cut into all of it
    if role == CLIENT_CAP and now is not None:
        now *= ev.decode_instances or 1.0
    if not now:
        return None
    bound, how = now * limit_ms / got, f"{limit.words} falls at most in proportion"
    line, run = tpot_line(history, history.best_knobs, ref.card.n, limit), ev.decode_running_mean  # type: ignore[union-attr]
    if line is not None and run:  # the line through the runs made: the batch at the limit less its spread
        batch = (limit_ms - line.spread(limit_ms) - line.a) / line.b
        bound, how = now * max(batch, 0.0) / run, f"the {limit.words} line over {line.points} run(s) reaches it at a batch of ~{batch:.0f}"
    downs = sorted(v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v < cur)
    if len(downs) < 2:
        return None
    target = max((v for v in downs if v <= bound), default=downs[0])
    if target == downs[-1]:
        return None
    what = "running in decode" if role == CLIENT_CAP else "running per decode instance"
    return target, (f"{now:.0f} {what} at a {limit.words} of {got:.1f} ms; {how}, so under the "
                    f"{limit_ms:g} ms limit needs at most ~{bound:.0f}; {knob} {target} is the largest listed value there")


def sized_rate(cur: Any, values: list[Any], history: History, limit: Limit | None) -> tuple[Any, str] | None:
    """Where the arrival rate binds: the listed rate a raise jumps to, beyond the next step. By Little's law the
    decode batch is r × (decode time per request) = k·r·TPOT (k read off the best station's run), and TPOT is
    the line a + b·batch, so batch = k·r·a / (1 - k·r·b): the largest listed rate whose batch stays under the
    station's batch cap and whose TPOT has an even chance under the limit. Needs the line (two batches). Little's
    law needs the mean TPOT (a request's decode time), read off the run whatever statistic the limit is on."""
    if not isinstance(cur, (int, float)) or limit is None:
        return None
    ref = history.latest_valid(history.best_knobs)
    if ref is None or ref.summary is None or not ref.summary.tpot_ms.mean:
        return None
    limit_ms = limit.limit_ms
    ev = ref.evidence
    line, run = tpot_line(history, history.best_knobs, ref.card.n, limit), ev.decode_running_mean
    inst = ev.decode_instances or 1.0
    cap = decode_cap(history.best_knobs, inst)
    if line is None or not run or not cap:
        return None
    k = run / (cur * ref.summary.tpot_ms.mean)
    sigma = line.spread(limit_ms)
    ups = sorted(v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v > cur)

    def at(r: float) -> tuple[float, float]:
        left = 1.0 - k * r * line.b
        batch = k * r * line.a / left if left > 0 else math.inf
        return batch, (line.at(batch) if batch <= cap else math.inf)

    best = largest_under(ups, at, limit_ms, sigma)
    if best is None:
        return None
    r, batch, tpot = best
    return r, (f"the rate binds; by Little's law and the {limit.words} line over {line.points} run(s), r={r:g} runs a decode "
               f"batch of ~{batch:.0f} at ~{tpot:.1f} ms, under the {limit_ms:g} ms limit: the largest listed rate there")


def normal_cdf(x: float, scale: float = 1.0) -> float:
    """P(X <= x) for X normal with mean 0 and standard deviation `scale`."""
    return CDF_HALF * (1.0 + math.erf(x / (scale * math.sqrt(2.0))))


def chance_under(limit_ms: float, tpot: float, sigma: float) -> float:
    """The chance a TPOT predicted at `tpot` with spread `sigma` stays under the limit (normal error)."""
    return normal_cdf(limit_ms - tpot, sigma)


def largest_under(ups: list[Any], at: Any, limit_ms: float, sigma: float) -> tuple[Any, float, float] | None:
    """Walking the listed values up (`ups`, ascending), the last whose (batch, TPOT) = at(value) keeps an even
    chance under the limit: (value, batch, TPOT). None: not beyond the first value up (a one-step move)."""
    got: tuple[Any, float, float] | None = None
    for v in ups:
        batch, tpot = at(v)
        if chance_under(limit_ms, tpot, sigma) < EVEN_CHANCE:
            break
        got = (v, batch, tpot)
    return None if got is None or len(ups) < 2 or got[0] == ups[0] else got


def station_line(history: History, knobs: dict[str, Any], ref: Outcome | None,
                 limit: Limit | None) -> tuple[Line, int, float, float, float] | None:
    """The line of the limit's figure through the station `knobs` (measured by `ref`) and what carries a batch along it: (line, its N,
    decode instances, the run's mean running batch per instance, its batch cap per instance). None without a line
    or those figures."""
    line = tpot_line(history, knobs, ref.card.n, limit) if ref is not None else None
    if ref is None or line is None:
        return None
    ev = ref.evidence
    inst = ev.decode_instances or 1.0
    run, cap0 = ev.decode_running_mean, decode_cap(knobs, inst)
    return (line, ref.card.n, inst, run, cap0) if run and cap0 else None


def _best_line(history: History, limit: Limit | None) -> tuple[Line, int, float, float, float] | None:
    """station_line of the best station, from its latest valid run."""
    return station_line(history, history.best_knobs, history.latest_valid(history.best_knobs), limit)


def sized_pair(history: History, values_c: list[Any], values_s: list[Any],
               limit: Limit | None) -> tuple[Any, Any, str] | None:
    """Where the client and the decode batch limit bind together (a C + max_num_seqs pair): the listed pair a raise
    jumps to, beyond the next step of both. Along the diagonal the client can fill (each listed max_num_seqs with
    the smallest listed C that fills it over the decode instances), the largest pair whose TPOT on the line (the
    best station's batch carried by batch_at, as predicted_tpot) has an even chance under the limit. Needs the
    line (two batches): without it the pair moves one step. None: no line, or the next step of both is already
    that far."""
    best = history.best_knobs
    c0, s0 = by_role(best, CLIENT_CAP), by_role(best, BATCH_CAP)
    station = _best_line(history, limit)
    if limit is None or station is None or not isinstance(c0, (int, float)) or not isinstance(s0, (int, float)):
        return None
    line, n, inst, run, cap0 = station
    limit_ms = limit.limit_ms

    def listed(vs: list[Any]) -> list[float]:
        return sorted(v for v in vs if isinstance(v, (int, float)) and not isinstance(v, bool))

    cs, ss = listed(values_c), listed(values_s)
    sigma = line.spread(limit_ms)
    steps: list[tuple[Any, Any, float, float]] = []
    for s in (v for v in ss if v > s0):
        c = next((v for v in cs if v >= c0 and v / inst >= s), None)
        if c is None:
            break  # the client cannot fill a wider batch
        if c <= c0:
            continue  # C alone is not what moves here
        batch = batch_at(run, cap0, min(s, c / inst), n, inst)
        tpot = line.at(batch)
        if chance_under(limit_ms, tpot, sigma) < EVEN_CHANCE:
            break
        steps.append((c, s, batch, tpot))
    c_up = next((v for v in cs if v > c0), None)
    s_up = next((v for v in ss if v > s0), None)
    if not steps or (steps[-1][0], steps[-1][1]) == (c_up, s_up):
        return None
    c, s, batch, tpot = steps[-1]
    return c, s, (f"the {limit.words} line over {line.points} run(s) ({line.a:.1f} + {line.b:.4f} ms per sequence) puts "
                  f"C={c:g} with {named(BATCH_CAP, best)}={s:g} at a decode batch of ~{batch:.0f} and ~{tpot:.1f} ms, "
                  f"under the {limit_ms:g} ms limit: the largest listed pair there")


def sized_draft_batch(history: History, values_s: list[Any], factor: float, why: str,
                      limit: Limit | None) -> tuple[Any, str] | None:
    """Where a wider draft moves with the decode batch limit (a num_speculative_tokens + max_num_seqs pair): the
    listed max_num_seqs the pair jumps to, beyond the next step. The draft changes tokens per step and the step's
    cost, not the batch's share of it, so the TPOT line of the current width, scaled by `factor` (the acceptance
    model's TPOT at the new width over the old, `why`), is the new width's line; the largest listed limit whose
    batch (the best station's, carried by batch_at) has an even chance under the TPOT limit on it. The client's C
    still caps the batch the pair itself runs; the wider limit is what a later hot raise of C fills. Needs the line
    (two batches at the current width). None: no line, or the next step is already that far."""
    s0 = by_role(history.best_knobs, BATCH_CAP)
    station = _best_line(history, limit)
    if limit is None or not factor > 0 or station is None or not isinstance(s0, (int, float)):
        return None
    line, n, inst, run, cap0 = station
    limit_ms = limit.limit_ms
    sigma = line.spread(limit_ms)
    ups = sorted(v for v in values_s if isinstance(v, (int, float)) and not isinstance(v, bool) and v > s0)

    def at(s: float) -> tuple[float, float]:
        batch = batch_at(run, cap0, s, n, inst)
        return batch, factor * line.at(batch)

    got = largest_under(ups, at, limit_ms, sigma)
    if got is None:
        return None
    s, batch, tpot = got
    return s, (f"the {limit.words} line over {line.points} run(s) at this draft width ({line.a:.1f} + {line.b:.4f} ms per "
               f"sequence) × {factor:.2f} ({why}) puts {named(BATCH_CAP, history.best_knobs)}={s:g} at a decode "
               f"batch of ~{batch:.0f} and ~{tpot:.1f} ms, under the {limit_ms:g} ms limit: the largest listed limit "
               f"there, for C to fill")

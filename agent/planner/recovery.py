"""Recoveries: a confirmed gain the goal cannot take as it is, turned into the one run that can keep it.

* window recovery: a confirm that won without the objective's native window is run again, hot, at the next
  higher rate (when arrivals left C unfilled) or the next lower C, until a run gives the window;
* latency recovery: a load move that gained but broke only decode-side latency limits (mean TPOT, a TPOT or ITL
  tail: core/goalview.py) is followed by a decode batch cap (max_num_seqs) at the batch the best station ran at, or
  at the largest cap the line of the broken limit's figure keeps under the limit less its spread, from the
  violating station.

Both run at the confirm N from the station they recover (not the best station) and are judged against the
best station (agent.planner.judgement.decide), since that station is no reference.
"""
from __future__ import annotations

from agent.planner.candidates import CandidateCard, build_card
from agent.planner.history import History, Outcome
from agent.planner.rules.client_supply import CAP_FILLED
from agent.planner.tpot_fit import batch_at, line_limit, station_line
from core.goalview import GoalView, Limit
from core.knobs import ARRIVAL_RATE, BATCH_CAP, CLIENT_CAP, named, role_of

LOAD_UP = (CLIENT_CAP, ARRIVAL_RATE)  # roles of the load knobs a latency recovery follows when they go up


def line_cap(history: History, violating: Outcome, caps: list, limit: Limit | None) -> tuple[int, str] | None:
    """The largest of `caps` (listed max_num_seqs values at or above the batch the best station ran) whose decode
    batch the line of the limit's figure through the runs of the violating station's draft, model and layout (its own run among
    them) keeps under the limit less the line's spread. The batch at a cap is the violating run's, carried by the
    closed-loop run model (agent/planner/tpot_fit.py batch_at), since the load that broke the limit queues for the cap.
    None: no line, or only the smallest cap is that sure (the cap the best station's own run vouches for)."""
    station = station_line(history, violating.card.knobs, violating, limit)
    if limit is None or station is None:
        return None
    line, n, inst, run, cap0 = station
    limit_ms = limit.limit_ms
    sigma = line.spread(limit_ms)

    def batch(v: float) -> float:
        return batch_at(run, cap0, min(v, cap0), n, inst)

    sure = [v for v in caps if line.at(batch(v)) + sigma <= limit_ms]
    if not sure or max(sure) == min(caps):
        return None
    v = max(sure)
    return v, (f"the {limit.words} line over {line.points} run(s) ({line.a:.1f} + {line.b:.4f} ms per sequence) puts a batch "
               f"of ~{batch(v):.0f} at {line.at(batch(v)):.1f} ms, within the limit less its {sigma:.1f} ms spread")


def rate_starved(summary) -> bool:  # type: ignore[no-untyped-def]
    """In flight stayed well under C on average: arrivals, not the cap, decided what was in flight."""
    w = summary.whole if summary is not None else None
    return bool(w is not None and summary.concurrency and w.achieved_concurrency is not None
                and w.achieved_concurrency < CAP_FILLED * summary.concurrency)


def window_recovery(history: History) -> CandidateCard | None:
    """A confirm that won without the objective's window: run its station hot, at confirm N, until one run
    gives the window. When in-flight never filled C (arrivals too slow), first the next higher rate (the
    window and more throughput); then the next lower C values (fewer in flight reach C sooner, at some
    throughput). The whole window's verdict at a screen cannot judge this."""
    goal = history.goal
    space = goal.space()
    rate, client = named(ARRIVAL_RATE, space), named(CLIENT_CAP, space)
    if goal.objective.window != "native" or (rate is None and client is None):
        return None
    done = history.finished_keys
    for o in reversed(history.outcomes):
        if o.decision != "window_pending":
            continue
        station = o.card.knobs
        moves: list[tuple[str, object, str, str]] = []
        r = station.get(rate) if rate is not None else None
        if rate is not None and r is not None and rate_starved(o.summary):
            higher = sorted(v for v in space[rate] if v is not None and v > r)
            if higher:
                moves.append((rate, higher[0], "client_supply",
                              "arrivals faster than the server drains them keep in-flight at C long enough for a "
                              "valid native window"))
        if client is not None:
            for c in sorted((v for v in space[client] if v is not None), reverse=True):
                if c < (station.get(client) or 0):
                    moves.append((client, c, "latency_bound", "fewer requests in flight keep in-flight == C "
                                                                     "long enough for a valid native window"))
        for knob, value, hyp, mechanism in moves:
            up = role_of(knob) == ARRIVAL_RATE
            card = build_card(history.goal_id, goal.scenario, station, knob, value, stage="confirm",
                              n=goal.protocol.confirm_n, direction="up" if up else "down", hypothesis=hyp,
                              mechanism=mechanism,
                              decision="whether the confirmed whole-window gain holds in the objective's window",
                              expected_effect=("a valid native window and more throughput; TPOT a little higher" if up
                                               else "a valid native window; whole-run throughput may fall a little"),
                              negative_rules_out=f"{knob}={value} as the way to a valid native window at this station")
            if card.experiment_key not in done:
                return card
            got = history.reference(card.knobs, card.n)
            if got is not None and got.figures is not None and got.figures.native is not None:
                break  # the window was recovered here: judged already, nothing more to recover at this station
        return None  # only the latest pending station is worth recovering
    return None


def decode_only(o: Outcome, view: GoalView) -> bool:
    """The run broke the SLO on decode-side latency limits (mean TPOT, a TPOT or ITL tail) and on nothing else: every
    violation recorded is one of the limits its summary breaks (none is a contract's), each on the decode side."""
    v = o.figures.slo_violations if o.figures is not None else []
    broken = view.broken(o.summary) if o.summary is not None else ()
    return bool(v) and len(broken) == len(v) and all(x.side == "decode" for x in broken)


def batch_cap_available(history: History) -> bool:
    """A decode-side limit binding at the best station, max_num_seqs in the space, and a listed cap below the best
    station's that still holds the batch it ran at: a load gain that crosses the limit has a way back (see
    latency_recovery)."""
    goal = history.goal
    space = goal.space()
    ref = history.latest_valid(history.best_knobs)
    ran = ref.evidence.decode_running_max if ref is not None else None
    seqs = named(BATCH_CAP, space)
    cur = history.best_knobs.get(seqs) if seqs is not None else None
    if line_limit(history) is None or seqs is None or ran is None or cur is None:
        return False
    return any(v is not None and ran <= v < cur for v in space[seqs])


def latency_recovery(history: History) -> CandidateCard | None:
    """A load move from the best station that gained on the objective but broke only decode-side limits (mean TPOT,
    a TPOT or ITL tail): the decode batch grew past what the limit allows. Cap the decode batch (max_num_seqs) at the smallest listed
    value that still holds the batch the best station ran at (it met the limit there), from the violating
    station, so the extra load queues before decode instead of stretching every decode step; run at the confirm N
    (like a window recovery: the violating station is no reference) and judged against the best station."""
    goal = history.goal
    space = goal.space()
    seqs = named(BATCH_CAP, space)
    view = goal.view()
    if seqs is None or not any(x.side == "decode" for x in view.limits):
        return None
    done = history.finished_keys
    for o in reversed(history.outcomes):
        c = o.card.change
        if o.card.stage == "baseline" or o.verdict != "valid" or c is None:
            continue
        if o.decision != "negative" or not decode_only(o, view) or o.card.parent_knobs_hash != history.best_knobs_hash:
            return None  # only the latest judged experiment, and only a load move that broke decode latency alone
        if role_of(c.knob) not in LOAD_UP or c.old is None or not (c.new is None or c.new > c.old):
            return None
        ref = history.reference(o.card.parent_knobs, o.card.n)
        win = "native" if goal.objective.window == "native" and o.figures.native is not None \
            and ref is not None and ref.figures is not None and ref.figures.native is not None else "whole"
        got = getattr(o.figures, win)
        base = getattr(ref.figures, win) if ref is not None and ref.figures is not None else None
        if got is None or not base or got < base * (1 + goal.stop.min_gain_pct / 100.0):
            return None  # no gain to keep: nothing worth recovering
        ran = ref.evidence.decode_running_max if ref is not None else None
        cur = o.card.knobs.get(seqs)
        viol_max = o.evidence.decode_running_max
        if ran is None or cur is None:
            return None
        fits = sorted(v for v in space[seqs] if v is not None and ran <= v < cur
                      and (viol_max is None or v < viol_max))
        if not fits:
            return None
        broken = view.decode_limit(o.summary)  # the decode-side limit the violating run broke most
        cap, why = fits[0], f"the best station ran up to {ran:.0f} within the {broken.words} limit"  # type: ignore[union-attr]
        sized = line_cap(history, o, fits, broken)
        if sized is not None:
            cap, why = sized
        card = build_card(history.goal_id, goal.scenario, o.card.knobs, seqs, cap, stage="confirm",
                          n=goal.protocol.confirm_n, direction="down", hypothesis="latency_bound",
                          mechanism=(f"cap the decode batch at {cap} ({why}): the extra load queues before decode "
                                     f"instead of stretching every decode step"),
                          decision=f"whether the load's gain survives inside the {broken.words} limit",  # type: ignore[union-attr]
                          expected_effect=f"{broken.words} back under the limit, most of the {got / base - 1:+.0%} kept; TTFT rises",
                          negative_rules_out=f"a decode batch cap of {cap} as the way to keep this load's gain")
        return None if card.experiment_key in done else card
    return None

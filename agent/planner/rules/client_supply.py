"""Client supply: the sender, not the server, holds the load down; which of its two limits binds (the arrival
rate r or the concurrency cap C) decides which of them is worth raising."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from agent.planner.rules.base import QUEUE_PERSISTENT, Adjusted, Ctx, Hypothesis, MoveRule, Rule, clamp
from agent.planner.tpot_fit import line_limit, sized_rate
from core.knobs import ARRIVAL_RATE, CLIENT_CAP, role_of
from core.summary import Summary

if TYPE_CHECKING:  # annotations only: the diagnosis and the history import the rules
    from agent.planner.cards import Change
    from agent.planner.diagnosed import Diagnosis
    from agent.planner.history import History

NOT_BINDING = 0.25  # a higher C while r holds the load down (or a higher r while C does) changes nothing in flight
PRIOR = 0.1  # the scorer's start (a judgement): weak until the run shows the sender holding the load down
FREE_SLOTS = 0.7  # in flight under 70 % of C: the sender leaves slots free (protocol § 4, "under 70 % of C in flight")
CAP_FILLED = 0.9  # in flight within 10 % of C: the cap's slots are in use, so C (not r) holds the load
# QPS more than 20 % under r with free slots: beyond a finite run's drain (r=24 over 640 requests gives 20.7, 86 %)
QPS_SHORT = 0.8  # the sender falls short of its own rate
QPS_AT_RATE = 0.95  # the scorer's "QPS ≈ r": within 5 % of what r gives over the run's drain (n / (n/r + E2E))
RATE_BINDS = 0.9  # client_limit's "QPS ≈ r": at least 0.9 of what r gives over the drain (protocol § 4)
W_FREE_SLOTS = 0.35  # a scorer weight (judgement): free slots are the direct sign of a starved server (0.45, open)
W_SLOTS_USED = 0.05  # a nudge against (judgement): in flight ≈ C says little alone, as C itself may be what binds
W_SENDER_SHORT = 0.2  # a scorer weight (judgement): QPS short of r with free slots, the sender cannot keep its rate
W_RATE_BINDS = 0.2  # a scorer weight (judgement): QPS ≈ r, the sender's configured rate may be the limit
W_QUEUED_INSIDE = 0.1  # a scorer weight (judgement): a queue inside the server says the client is not starving it
GAIN_RATE_UP = 0.15  # the move's prior gain (a judgement): a higher r adds load only where the rate binds


def offered_qps(s: Summary, win: Any) -> float:
    """The completion rate a window shows when the arrival rate r alone sets the load: the window's requests
    are sent over n/r seconds and the last of them completes about one mean E2E later, so a finite run's QPS
    sits below r by its drain (n/r against n/r + E2E), more so the shorter the run. r itself when the window
    has no count or no E2E."""
    r, n, e2e = s.request_rate, win.n_requests, s.e2e_ms.mean
    if not n or not e2e or not r or not math.isfinite(r):
        return r
    return n / (n / r + e2e / 1000.0)


def score(ctx: Ctx) -> Hypothesis:
    s, ev = ctx.summary, ctx.ev
    pfor, pagainst, sc = [], [], PRIOR
    win = s.native or s.whole if s else None
    if s is not None and win is not None and s.concurrency:
        ratio = win.achieved_concurrency / s.concurrency
        if ratio < FREE_SLOTS:
            pfor.append(f"achieved concurrency {win.achieved_concurrency:.1f} is {ratio:.0%} of C={s.concurrency}")
            sc += W_FREE_SLOTS
        else:
            pagainst.append(f"achieved concurrency {win.achieved_concurrency:.1f} ≈ C={s.concurrency}")
            sc -= W_SLOTS_USED
        if s.request_rate and math.isfinite(s.request_rate):
            if win.qps < QPS_SHORT * s.request_rate and ratio < FREE_SLOTS:
                pfor.append(f"QPS {win.qps:.2f} below r={s.request_rate:g} with free concurrency slots")
                sc += W_SENDER_SHORT
            elif win.qps >= QPS_AT_RATE * offered_qps(s, win):
                pfor.append(f"QPS {win.qps:.2f} ≈ r={s.request_rate:g} (less the run's drain): the sender's rate "
                            f"may be the limit")
                sc += W_RATE_BINDS
    pshare = ev.prefill_waiting_nonzero_share
    if pshare is not None and pshare >= QUEUE_PERSISTENT:
        pagainst.append("requests are queueing inside the server, so the client is not starving it")
        sc -= W_QUEUED_INSIDE
    return Hypothesis(name="client_supply", likelihood=clamp(sc), evidence_for=pfor, evidence_against=pagainst)


def client_limit(s: Summary | None) -> tuple[str | None, str | None]:
    """Which of the sender's two limits holds the offered load down, as a knob role: the arrival rate
    (ARRIVAL_RATE) or the concurrency cap (CLIENT_CAP)."""
    win = (s.native or s.whole) if s else None
    if s is None or win is None or not s.concurrency or win.achieved_concurrency is None:
        return None, None
    ratio = win.achieved_concurrency / s.concurrency
    if ratio >= CAP_FILLED:
        return CLIENT_CAP, (f"achieved concurrency {win.achieved_concurrency:.1f} ≈ C={s.concurrency}: a higher "
                            f"arrival rate only queues at the sender")
    r = s.request_rate
    if r and math.isfinite(r) and ratio < FREE_SLOTS and win.qps >= RATE_BINDS * offered_qps(s, win):
        drain = "" if offered_qps(s, win) == r else f" (the {offered_qps(s, win):.2f} r gives over the run's drain)"
        return ARRIVAL_RATE, (f"QPS {win.qps:.2f} ≈ r={r:g}{drain} with {ratio:.0%} of C={s.concurrency} in "
                              f"flight: a higher C adds nothing while the rate binds")
    return None, None


def value(change: Change, up: bool, diag: Diagnosis, conf: float, gain: float) -> Adjusted | None:
    """C vs r: raising the sender's limit that does not bind keeps a quarter of its confidence."""
    other = {CLIENT_CAP: ARRIVAL_RATE, ARRIVAL_RATE: CLIENT_CAP}.get(role_of(change.knob))
    if up and other is not None and diag.client_limit == other:
        return Adjusted(conf * NOT_BINDING, gain, f" × {NOT_BINDING} = {conf * NOT_BINDING:.2f} ({diag.client_limit_why})")
    return None


def sized(knob: str, cur: Any, values: list, history: History, diag: Diagnosis | None) -> tuple[str, Any, str] | None:
    """Where the arrival rate binds: a raise of r sized by Little's law along the fitted TPOT line
    (agent/planner/tpot_fit.py), not the next listed rate."""
    if role_of(knob) != ARRIVAL_RATE or diag is None or diag.client_limit != ARRIVAL_RATE:
        return None
    got = sized_rate(cur, values, history, line_limit(history))
    return None if got is None else ("up", got[0], got[1])


RULE = Rule(
    name="client_supply",
    prompt=("client_supply: achieved concurrency far below C points at the client; QPS ≈ r with free slots means r "
            "binds (raise r, not C); in flight ≈ C means C binds (raise C, not r)."),
    score=score, value=value, sized=sized,
    moves={
        (ARRIVAL_RATE, "up"): MoveRule(
            hypotheses=("client_supply",), gain=GAIN_RATE_UP,
            mechanism="a higher arrival rate feeds the concurrency cap", decision="whether the sender's rate limits",
            expected="higher throughput if QPS ≈ r", rules_out="the arrival rate as the limit"),
    })

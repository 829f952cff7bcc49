"""Client supply: the sender, not the server, holds the load down; which of its two limits binds (the arrival
rate r or the concurrency cap C) decides which of them is worth raising."""
from __future__ import annotations

import math
from typing import Any

from agent.planner.rules.base import Adjusted, Ctx, Hypothesis, MoveRule, Rule, clamp, num
from agent.planner.tpot_fit import sized_rate
from core.summary import Summary

NOT_BINDING = 0.25  # a higher C while r holds the load down (or a higher r while C does) changes nothing in flight


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
    pfor, pagainst, sc = [], [], 0.1
    win = s.native or s.whole if s else None
    if s is not None and win is not None and s.concurrency:
        ratio = win.achieved_concurrency / s.concurrency
        if ratio < 0.7:
            pfor.append(f"achieved concurrency {win.achieved_concurrency:.1f} is {ratio:.0%} of C={s.concurrency}")
            sc += 0.35
        else:
            pagainst.append(f"achieved concurrency {win.achieved_concurrency:.1f} ≈ C={s.concurrency}")
            sc -= 0.05
        if s.request_rate and math.isfinite(s.request_rate):
            if win.qps < 0.8 * s.request_rate and ratio < 0.7:
                pfor.append(f"QPS {win.qps:.2f} below r={s.request_rate:g} with free concurrency slots")
                sc += 0.2
            elif win.qps >= 0.95 * offered_qps(s, win):
                pfor.append(f"QPS {win.qps:.2f} ≈ r={s.request_rate:g} (less the run's drain): the sender's rate "
                            f"may be the limit")
                sc += 0.2
    pshare = num(ev, "prefill_waiting_nonzero_share")
    if pshare is not None and pshare >= 0.5:
        pagainst.append("requests are queueing inside the server, so the client is not starving it")
        sc -= 0.1
    return Hypothesis(name="client_supply", likelihood=clamp(sc), evidence_for=pfor, evidence_against=pagainst)


def client_limit(s: Summary | None) -> tuple[str | None, str | None]:
    """Which of the sender's two limits holds the offered load down: the arrival rate or the concurrency cap."""
    win = (s.native or s.whole) if s else None
    if s is None or win is None or not s.concurrency or win.achieved_concurrency is None:
        return None, None
    ratio = win.achieved_concurrency / s.concurrency
    if ratio >= 0.9:
        return "concurrency", (f"achieved concurrency {win.achieved_concurrency:.1f} ≈ C={s.concurrency}: a higher "
                               f"arrival rate only queues at the sender")
    r = s.request_rate
    if r and math.isfinite(r) and ratio < 0.7 and win.qps >= 0.9 * offered_qps(s, win):
        drain = "" if offered_qps(s, win) == r else f" (the {offered_qps(s, win):.2f} r gives over the run's drain)"
        return "request_rate", (f"QPS {win.qps:.2f} ≈ r={r:g}{drain} with {ratio:.0%} of C={s.concurrency} in "
                                f"flight: a higher C adds nothing while the rate binds")
    return None, None


def value(change: Any, up: bool, diag: Any, conf: float, gain: float) -> Adjusted | None:
    """C vs r: raising the sender's limit that does not bind keeps a quarter of its confidence."""
    knob = change.knob
    other = {"concurrency": "request_rate", "request_rate": "concurrency"}.get(knob)
    if up and other is not None and diag.client_limit == other:
        return Adjusted(conf * NOT_BINDING, gain, f" × {NOT_BINDING} = {conf * NOT_BINDING:.2f} ({diag.client_limit_why})")
    return None


def sized(knob: str, cur: Any, values: list, history: Any, diag: Any) -> tuple[str, Any, str] | None:
    """Where the arrival rate binds: a raise of r sized by Little's law along the fitted TPOT line
    (agent/planner/tpot_fit.py), not the next listed rate."""
    if knob != "request_rate" or diag is None or diag.client_limit != "request_rate":
        return None
    got = sized_rate(cur, values, history, history.goal.constraints.tpot_mean_ms_lt)
    return None if got is None else ("up", got[0], got[1])


RULE = Rule(
    name="client_supply",
    prompt=("client_supply: achieved concurrency far below C points at the client; QPS ≈ r with free slots means r "
            "binds (raise r, not C); in flight ≈ C means C binds (raise C, not r)."),
    score=score, value=value, sized=sized,
    moves={
        ("request_rate", "up"): MoveRule(
            hypotheses=("client_supply",), gain=0.15,
            mechanism="a higher arrival rate feeds the concurrency cap", decision="whether the sender's rate limits",
            expected="higher throughput if QPS ≈ r", rules_out="the arrival rate as the limit"),
        ("parallel", "up"): MoveRule(
            hypotheses=("client_supply", "decode_capacity"), gain=0.2,
            mechanism="more server slots batch more sequences per step", decision="the server's batch width",
            expected="higher throughput, higher TPOT", rules_out="the slot count as the limit"),
    })

"""Latency bound: mean TPOT at (or over) its limit; get feasible first, then trade latency for throughput."""
from __future__ import annotations

from typing import Any

from agent.planner.rules.base import Adjusted, Ctx, Hypothesis, MoveRule, Rule, clamp
from agent.planner.tpot_fit import sized_down

FEASIBLE_GAIN = 0.3  # a move that may bring an infeasible best inside the TPOT limit: feasibility is the gain
FEASIBLE_CONFIDENCE = 0.7
TPOT_DOWN = {("concurrency", False), ("request_rate", False), ("max_num_seqs", False), ("speculative_method", True)}


def score(ctx: Ctx) -> Hypothesis:
    s, limit = ctx.summary, ctx.tpot_limit_ms
    if s is None or limit is None or s.tpot_ms.mean is None:
        return Hypothesis(name="latency_bound", likelihood=0.1, evidence_against=["no TPOT figure or no limit"])
    head = headroom(ctx)
    line = f"mean TPOT {s.tpot_ms.mean:.1f} ms leaves {head:.0%} headroom to {limit:g} ms"
    if head < 0.1:
        return Hypothesis(name="latency_bound", likelihood=clamp(0.7 + (0.1 - head) * 2), evidence_for=[line])
    return Hypothesis(name="latency_bound", likelihood=clamp(0.3 - head * 0.3), evidence_against=[line])


def headroom(ctx: Ctx) -> float | None:
    """1 - mean TPOT / limit (None without a TPOT figure or a limit)."""
    s, limit = ctx.summary, ctx.tpot_limit_ms
    if s is None or limit is None or s.tpot_ms.mean is None:
        return None
    return 1.0 - s.tpot_ms.mean / limit


def value(change: Any, up: bool, diag: Any, conf: float, gain: float) -> Adjusted | None:
    """Get feasible first: while the best breaks the TPOT limit, a move that lowers TPOT is worth what a
    feasible station is worth, whatever it costs in throughput."""
    if diag.tpot_headroom is None or diag.tpot_headroom >= 0 or (change.knob, up) not in TPOT_DOWN:
        return None
    return Adjusted(max(conf, FEASIBLE_CONFIDENCE), max(gain, FEASIBLE_GAIN),
                    f" (mean TPOT {-diag.tpot_headroom:.0%} over its limit: feasibility first)")


def sized(knob: str, cur: Any, values: list, history: Any, diag: Any) -> tuple[str, Any, str] | None:
    """While the best station breaks its TPOT limit: a cut of C or max_num_seqs sized along the latency (the
    proportional bound, then the fitted TPOT line: agent/planner/tpot_fit.py), not a fixed step."""
    if diag is None:
        return None
    got = sized_down(knob, cur, values, history, diag.tpot_headroom, history.goal.constraints.tpot_mean_ms_lt)
    return None if got is None else ("down", got[0], got[1])


RULE = Rule(
    name="latency_bound",
    prompt=("latency_bound: mean TPOT at or over its limit: get feasible first (fewer requests in flight, a decode "
            "batch cap); trade-offs are results, kept on the frontier."),
    score=score, value=value, separable=False, sized=sized,
    moves={
        ("concurrency", "down"): MoveRule(
            hypotheses=("latency_bound",), gain=0.03, tradeoff=True,
            mechanism="fewer requests in flight shorten queues: lower TTFT, TPOT and E2E, a longer steady state",
            decision="the throughput/latency trade-off point",
            expected="lower whole-run throughput, lower latency, maybe a valid native window",
            rules_out="a free latency win at this concurrency"),
        ("request_rate", "down"): MoveRule(
            hypotheses=("latency_bound",), gain=0.03, tradeoff=True,
            mechanism="fewer arrivals per second shorten the queues: lower TTFT and E2E, fewer requests in flight",
            decision="the throughput/latency trade-off point", expected="lower throughput, lower latency",
            rules_out="a free latency win at this arrival rate"),
        ("max_num_seqs", "down"): MoveRule(
            hypotheses=("latency_bound",), gain=0.03, tradeoff=True,
            mechanism="a smaller decode batch shortens every decode step: lower TPOT, less throughput per step",
            decision="the throughput/latency trade-off point", expected="lower TPOT, lower throughput",
            rules_out="the decode batch size as the TPOT lever"),
        ("speculative_method", "up"): MoveRule(
            hypotheses=("latency_bound", "decode_capacity"), gain=0.2,
            mechanism="MTP draft heads produce several tokens per decode step",
            decision="whether speculative decoding pays on this task",
            expected="lower TPOT, higher decode throughput on copy tasks", rules_out="speculative decoding on this task"),
    })

"""Latency bound: the goal's binding latency limit (the least slack: mean TPOT, a TTFT tail, an E2E p90 ...) at
or over its limit; get feasible first, then trade latency for throughput. Which moves lower it follows the side
the limit is on (core/goalview.py): fewer in flight lowers every latency; a smaller decode batch and drafts lower
the decode-side ones (TPOT, ITL); more prefill instances shorten the prefill queue behind a TTFT tail."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.planner.rules.base import WEAK, Adjusted, Ctx, Hypothesis, MoveRule, Rule, clamp
from agent.planner.tpot_fit import line_limit, sized_down
from core.knobs import ARRIVAL_RATE, BATCH_CAP, CLIENT_CAP, DRAFT_METHOD, PREFILL_INSTANCES, role_of

if TYPE_CHECKING:  # annotations only: the diagnosis and the history import the rules
    from agent.planner.cards import Change
    from agent.planner.diagnosed import Diagnosis
    from agent.planner.history import History

FEASIBLE_GAIN = 0.3  # a move that may bring an infeasible best inside its latency limit: feasibility is the gain
FEASIBLE_CONFIDENCE = 0.7  # a judgement: a move toward feasibility from an infeasible best is trusted over SUPPORTED
BOUND_HEADROOM = 0.1  # under 10 % headroom the limit binds (load_headroom's LOAD_HEADROOM: room to load above it)
BOUND_LIK = 0.7  # at the line latency is supported (a judgement), and more so the closer the figure is to its limit
OVER_SLOPE = 2  # likelihood per unit of headroom below the line: 0.9 at the limit, 1.0 from 5 % over it
ROOM_SCALE = 0.3  # with headroom, 0.3 − 0.3 × headroom (0.3 × figure / limit): weak, fading to 0 as it falls
GAIN_TRADEOFF = 0.03  # a trade-off move's prior gain: small, as it may lose on the objective by design (a judgement)
GAIN_DRAFT_ON = 0.2  # the move's prior gain (a judgement): several tokens per decode step where drafts are accepted
# (knob role, up) of the moves that lower the binding figure, by the side its limit is on (Limit.side)
LOAD_DOWN = {(CLIENT_CAP, False), (ARRIVAL_RATE, False)}  # fewer requests in flight: every latency falls
LOWERS = {"decode": LOAD_DOWN | {(BATCH_CAP, False), (DRAFT_METHOD, True)},
          "prefill": LOAD_DOWN | {(PREFILL_INSTANCES, True)}, "both": LOAD_DOWN}


def score(ctx: Ctx) -> Hypothesis:
    s, limit = ctx.summary, ctx.limit
    got = limit.figure(s) if limit is not None else None
    if limit is None or got is None:
        return Hypothesis(name="latency_bound", likelihood=WEAK, evidence_against=["no latency figure or no limit"])
    head = headroom(ctx)
    line = f"{limit.words} {got:.1f} ms leaves {head:.0%} headroom to {limit.limit_ms:g} ms"
    if head < BOUND_HEADROOM:
        return Hypothesis(name="latency_bound", likelihood=clamp(BOUND_LIK + (BOUND_HEADROOM - head) * OVER_SLOPE),
                          evidence_for=[line])
    return Hypothesis(name="latency_bound", likelihood=clamp(ROOM_SCALE - head * ROOM_SCALE), evidence_against=[line])


def headroom(ctx: Ctx) -> float | None:
    """1 - figure / limit of the binding limit (None without its figure or a limit)."""
    return None if ctx.limit is None else ctx.limit.slack(ctx.summary)


def value(change: Change, up: bool, diag: Diagnosis, conf: float, gain: float) -> Adjusted | None:
    """Get feasible first: while the best breaks its binding limit, a move that lowers that figure is worth what
    a feasible station is worth, whatever it costs in throughput."""
    moves = LOWERS.get(diag.binding_side or "")
    if diag.headroom is None or diag.headroom >= 0 or not moves or (role_of(change.knob), up) not in moves:
        return None
    return Adjusted(max(conf, FEASIBLE_CONFIDENCE), max(gain, FEASIBLE_GAIN),
                    f" ({diag.binding_words} {-diag.headroom:.0%} over its limit: feasibility first)")


def sized(knob: str, cur: Any, values: list, history: History, diag: Diagnosis | None) -> tuple[str, Any, str] | None:
    """While the best station breaks a decode-side limit: a cut of C or max_num_seqs sized along that latency (the
    proportional bound, then the fitted line: agent/planner/tpot_fit.py), not a fixed step."""
    if diag is None:
        return None
    got = sized_down(knob, cur, values, history, diag.headroom, line_limit(history))
    return None if got is None else ("down", got[0], got[1])


RULE = Rule(
    name="latency_bound",
    prompt=("latency_bound: the binding latency limit (mean TPOT, a TTFT or TPOT tail ...) at or over its limit: get "
            "feasible first (fewer requests in flight; a decode batch cap for TPOT/ITL, more prefill for TTFT); "
            "trade-offs are results, kept on the frontier."),
    score=score, value=value, separable=False, sized=sized,
    moves={
        (CLIENT_CAP, "down"): MoveRule(
            hypotheses=("latency_bound",), gain=GAIN_TRADEOFF, tradeoff=True,
            mechanism="fewer requests in flight shorten queues: lower TTFT, TPOT and E2E, a longer steady state",
            decision="the throughput/latency trade-off point",
            expected="lower whole-run throughput, lower latency, maybe a valid native window",
            rules_out="a free latency win at this concurrency"),
        (ARRIVAL_RATE, "down"): MoveRule(
            hypotheses=("latency_bound",), gain=GAIN_TRADEOFF, tradeoff=True,
            mechanism="fewer arrivals per second shorten the queues: lower TTFT and E2E, fewer requests in flight",
            decision="the throughput/latency trade-off point", expected="lower throughput, lower latency",
            rules_out="a free latency win at this arrival rate"),
        (BATCH_CAP, "down"): MoveRule(
            hypotheses=("latency_bound",), gain=GAIN_TRADEOFF, tradeoff=True,
            mechanism="a smaller decode batch shortens every decode step: lower TPOT, less throughput per step",
            decision="the throughput/latency trade-off point", expected="lower TPOT, lower throughput",
            rules_out="the decode batch size as the TPOT lever"),
        (DRAFT_METHOD, "up"): MoveRule(
            hypotheses=("latency_bound", "decode_capacity"), gain=GAIN_DRAFT_ON,
            mechanism="MTP draft heads produce several tokens per decode step",
            decision="whether speculative decoding pays on this task",
            expected="lower TPOT, higher decode throughput on copy tasks", rules_out="speculative decoding on this task"),
    })

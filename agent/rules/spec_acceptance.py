"""Spec acceptance: is one more draft position worth its draft cost? Read from the acceptance per draft position
(share of drafts whose position i+1 was accepted) and the draft share of decode time; without per-position
figures, the mean acceptance length says only whether drafts are mostly wasted."""
from __future__ import annotations

from typing import Any

from agent.rules.base import Adjusted, Ctx, Hypothesis, MoveRule, Rule, clamp, num, role_terms

DEFAULT_DRAFT_COST = 0.05  # one draft position's cost relative to a target-model decode step, when not measured
MODEL_CONFIDENCE = 0.6  # measured acceptance per position: the model of a width change is that sure


def positions(ev: dict[str, Any]) -> list[float] | None:
    p = ev.get("spec_accept_per_position")
    if not isinstance(p, list) or not p or not all(isinstance(x, (int, float)) for x in p):
        return None
    return [max(0.0, min(1.0, float(x))) for x in p]


def draft_cost(ev: dict[str, Any], k: int) -> float | None:
    """One draft position's time relative to the rest of a decode step, from the breakdown's draft_s."""
    share = role_terms(ev, "draft_s").get("decode")
    if share is None or k <= 0 or share >= 1.0:
        return None
    return share / (1.0 - share) / k


def predicted_gain(p: list[float], k_old: int, k_new: int, cost: float) -> float:
    """Relative decode throughput of k_new draft positions over k_old: tokens per step / step time. Positions past
    the measured ones are extrapolated geometrically from the last two (acceptance only falls with depth)."""
    acc = list(p)
    while len(acc) < max(k_old, k_new):
        last = acc[-1]
        ratio = min(1.0, last / acc[-2]) if len(acc) >= 2 and acc[-2] > 0 else 0.8
        acc.append(last * ratio)

    def rate(k: int) -> float:
        return (1.0 + sum(acc[:k])) / (1.0 + k * cost)

    return rate(k_new) / rate(k_old) - 1.0 if rate(k_old) > 0 else 0.0


def score(ctx: Ctx) -> Hypothesis:
    al = num(ctx.ev, "spec_accept_length")
    k = int(ctx.knobs.get("num_speculative_tokens") or 0)
    p = positions(ctx.ev)
    if p is not None and k > 0:
        cost = draft_cost(ctx.ev, k)
        c = DEFAULT_DRAFT_COST if cost is None else cost
        last = p[min(k, len(p)) - 1]
        line = (f"acceptance per position {[round(x, 2) for x in p[:k]]}: position {k} accepted in {last:.0%} of "
                f"drafts at a draft cost of {c:.2f} step per position" + (" (assumed)" if cost is None else ""))
        if last < c:  # the last position earns less than it costs: the draft is too wide
            return Hypothesis(name="spec_acceptance", likelihood=clamp(0.6 + (c - last)), evidence_for=[line])
        return Hypothesis(name="spec_acceptance", likelihood=0.15, evidence_against=[line])
    if al is None or k <= 0:
        return Hypothesis(name="spec_acceptance", likelihood=0.1,
                          evidence_against=["no speculative decoding in use: acceptance length not observed"])
    # AL = 1 + accepted/drafts; the ceiling is k + 1. Under ~half the extra tokens accepted is "low".
    frac = (al - 1.0) / k
    if frac < 0.5:
        return Hypothesis(name="spec_acceptance", likelihood=clamp(0.5 + (0.5 - frac)),
                          evidence_for=[f"acceptance length {al:.2f} of a possible {k + 1}: drafts mostly wasted"])
    return Hypothesis(name="spec_acceptance", likelihood=0.15,
                      evidence_against=[f"acceptance length {al:.2f} of a possible {k + 1}"])


def value(change: Any, up: bool, diag: Any, conf: float, gain: float) -> Adjusted | None:
    """A draft-width change valued by the acceptance model: the predicted gain, or nothing when it loses."""
    if change.knob != "num_speculative_tokens" or diag.spec_positions is None:
        return None
    try:
        k_old, k_new = int(change.old or 0), int(change.new or 0)
    except (TypeError, ValueError):
        return None
    if k_old <= 0 or k_new <= 0:
        return None  # switching drafting on or off is speculative_method's question
    cost = DEFAULT_DRAFT_COST if diag.draft_cost is None else diag.draft_cost
    g = predicted_gain(diag.spec_positions, k_old, k_new, cost)
    note = f" (acceptance model: k {k_old} -> {k_new} predicts {g:+.1%} decode throughput at {cost:.2f} step/position)"
    if g <= 0:
        return Adjusted(conf, 0.0, note, answered=True)
    return Adjusted(max(conf, MODEL_CONFIDENCE), g, note)


RULE = Rule(
    name="spec_acceptance",
    prompt=("spec_acceptance: from acceptance per draft position: one more position is worth it when its expected "
            "acceptance exceeds its draft cost (draft share of decode time per position); a last position accepted "
            "less often than it costs calls for a narrower draft."),
    score=score, value=value,
    moves={
        ("num_speculative_tokens", "up"): MoveRule(
            hypotheses=("latency_bound", "decode_capacity"), gain=0.1,
            mechanism="a wider draft accepts more tokens per step when acceptance is high",
            decision="the draft width", expected="higher decode throughput if acceptance stays high",
            rules_out="a wider draft at this acceptance"),
        ("num_speculative_tokens", "down"): MoveRule(
            hypotheses=("spec_acceptance",), gain=0.1,
            mechanism="a narrower draft wastes fewer device cycles on rejected tokens",
            decision="the draft width", expected="gain only if acceptance length is low",
            rules_out="draft waste as the limit"),
    })

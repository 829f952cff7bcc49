"""KV capacity: the KV cache is what admits sequences (usage near full, decode below its batch limit with a
queue); more memory for KV, not a bigger batch limit, is the lever."""
from __future__ import annotations

from agent.planner.rules.base import (
    KV_FULL, WAITING_NEAR_ZERO, WEAK, Ctx, Hypothesis, MoveRule, Rule, clamp, decode_at_limit,
)
from core.knobs import KV_MEMORY_FRACTION

# KV_FULL (0.95, from base): KV usage within 5 % of full, near enough that KV space may admit sequences
FULL_LIK = 0.45  # KV near full alone leaves the hypothesis open (a judgement): the decode queue decides it
W_QUEUED = 0.15  # a scorer weight (judgement): requests wait behind the full KV; 0.45 + 0.15 reaches SUPPORTED
W_NO_QUEUE = 0.3  # a scorer weight (judgement): a KV peak nobody waits behind turns no request away (0.15: weak)
W_AT_BATCH_LIMIT = 0.15  # a scorer weight (judgement): the batch limit binds too, so KV is not alone in admitting
GAIN_KV_MEMORY = 0.1  # the move's prior gain (a judgement): more KV memory pays only where KV usage is near full


def score(ctx: Ctx) -> Hypothesis:
    ev = ctx.ev
    kv, dmean = ev.decode_kv_usage_max, ev.decode_waiting_mean  # decode's KV, not prefill's
    if kv is None:
        return Hypothesis(name="kv_capacity", likelihood=WEAK, evidence_against=["no KV usage observed"])
    if kv < KV_FULL:
        return Hypothesis(name="kv_capacity", likelihood=WEAK, evidence_against=[f"KV cache usage peaked at {kv:.0%}"])
    pfor, pagainst, s = [f"KV cache usage reached {kv:.0%}"], [], FULL_LIK
    if dmean is not None and dmean > WAITING_NEAR_ZERO:
        pfor.append(f"{dmean:.1f} requests wait for decode")
        s += W_QUEUED
    elif dmean is not None:
        pagainst.append(f"decode waiting near zero (mean {dmean:.2f}): the KV peak turns no request away")
        s -= W_NO_QUEUE
    if decode_at_limit(ev):
        pagainst.append("decode also runs at its batch limit: the limit, not only KV, admits sequences")
        s -= W_AT_BATCH_LIMIT
    return Hypothesis(name="kv_capacity", likelihood=clamp(s), evidence_for=pfor, evidence_against=pagainst)


RULE = Rule(
    name="kv_capacity",
    prompt="kv_capacity: KV cache usage near full with a decode queue: more KV memory admits more sequences.",
    score=score, separable=False,
    moves={
        (KV_MEMORY_FRACTION, "up"): MoveRule(
            hypotheses=("kv_capacity", "decode_capacity"), gain=GAIN_KV_MEMORY,
            mechanism="more KV capacity admits more running sequences", decision="whether KV capacity binds",
            expected="gain only if KV usage is near full", rules_out="KV capacity as the limit"),
    })

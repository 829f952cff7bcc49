"""KV capacity: the KV cache is what admits sequences (usage near full, decode below its batch limit with a
queue); more memory for KV, not a bigger batch limit, is the lever."""
from __future__ import annotations

from agent.planner.rules.base import Ctx, Hypothesis, MoveRule, Rule, clamp, decode_at_limit, num

KV_FULL = 0.95


def score(ctx: Ctx) -> Hypothesis:
    ev = ctx.ev
    kv, dmean = num(ev, "kv_usage_max"), num(ev, "decode_waiting_mean")
    if kv is None:
        return Hypothesis(name="kv_capacity", likelihood=0.1, evidence_against=["no KV usage observed"])
    if kv < KV_FULL:
        return Hypothesis(name="kv_capacity", likelihood=0.1, evidence_against=[f"KV cache usage peaked at {kv:.0%}"])
    pfor, pagainst, s = [f"KV cache usage reached {kv:.0%}"], [], 0.45
    if dmean is not None and dmean > 0.5:
        pfor.append(f"{dmean:.1f} requests wait for decode")
        s += 0.15
    elif dmean is not None:
        pagainst.append(f"decode waiting near zero (mean {dmean:.2f}): the KV peak turns no request away")
        s -= 0.3
    if decode_at_limit(ev):
        pagainst.append("decode also runs at its batch limit: the limit, not only KV, admits sequences")
        s -= 0.15
    return Hypothesis(name="kv_capacity", likelihood=clamp(s), evidence_for=pfor, evidence_against=pagainst)


RULE = Rule(
    name="kv_capacity",
    prompt="kv_capacity: KV cache usage near full with a decode queue: more KV memory admits more sequences.",
    score=score, separable=False,
    moves={
        ("gpu_memory_utilization", "up"): MoveRule(
            hypotheses=("kv_capacity", "decode_capacity"), gain=0.1,
            mechanism="more KV capacity admits more running sequences", decision="whether KV capacity binds",
            expected="gain only if KV usage is near full", rules_out="KV capacity as the limit"),
    })

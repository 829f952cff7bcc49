"""KV-transfer bound: in a disaggregated deployment the P->D KV transfer, not compute, takes the time (the
breakdown's communication share); more prefill supply only queues at the link, the P/D split is the lever."""
from __future__ import annotations

from typing import Any

from agent.rules.base import Adjusted, Ctx, Hypothesis, Rule, clamp, role_terms

BOUND = 0.3  # communication share of a role's device time that makes the transfer the limit
DAMP = 0.5  # a prefill-supply move while the transfer binds keeps this share of its confidence
PREFILL_KNOBS = ("max_prefill_reqs", "max_num_batched_tokens", "chunked_prefill_size", "num_prefill_instances")


def score(ctx: Ctx) -> Hypothesis:
    terms = role_terms(ctx.ev, "communication_s")
    if not terms:
        return Hypothesis(name="kv_transfer", likelihood=0.1, evidence_against=["no communication time observed"])
    role, share = max(terms.items(), key=lambda kv: kv[1])
    line = f"breakdown: {share:.0%} of {role} device time is communication (KV transfer)"
    if share >= BOUND:
        return Hypothesis(name="kv_transfer", likelihood=clamp(0.3 + share), evidence_for=[line])
    return Hypothesis(name="kv_transfer", likelihood=0.1, evidence_against=[line])


def value(change: Any, up: bool, diag: Any, conf: float, gain: float) -> Adjusted | None:
    if up and change.knob in PREFILL_KNOBS and diag.likelihood("kv_transfer") >= 0.6:
        return Adjusted(conf * DAMP, gain, f" × {DAMP} (the KV transfer binds: more prefill queues at the link)")
    return None


RULE = Rule(
    name="kv_transfer",
    prompt=("kv_transfer: a large communication share in the breakdown means the P->D KV transfer binds: more "
            "prefill supply only queues at the link; change the P/D split instead."),
    score=score, value=value)

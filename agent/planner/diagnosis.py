"""Explain the evidence before choosing a knob: named hypotheses with evidence for and against.

Pure: a Summary, the evidence digest (executor.evidence.digest keys) and the goal's latency limits (core/goalview.py
rows, any metric at any statistic) in, a Diagnosis out; the rules read the limit that binds at the run. Each hypothesis is scored by its rule (agent/planner/rules/<hypothesis>.py, registered in
agent.planner.rules.RULES). Thresholds are coarse on purpose; the planner only needs to rank explanations and
know when the queue evidence cannot separate them (then, and only then, a profile is worth asking for).
"""
from __future__ import annotations

from typing import Any

from agent.planner.cards import CandidateCard
from agent.planner.diagnosed import Diagnosis
from agent.planner.history import History
from agent.planner.rules import NAMES, RULES
from agent.planner.rules.base import OPEN_LOW, SUPPORTED, Ctx, Hypothesis, decode_at_limit, decode_full
from agent.planner.rules.client_supply import client_limit
from agent.planner.rules.decode_capacity import decode_demand
from agent.planner.rules.expert_imbalance import imbalance_loss
from agent.planner.rules.kv_transfer import transfer_wait
from agent.planner.rules.latency_bound import headroom as latency_headroom
from agent.planner.rules.load_headroom import LOAD_HEADROOM
from agent.planner.rules.prefill_supply import BUDGET_FULL, CAP_FULL, prefill_limit
from agent.planner.rules.spec_acceptance import draft_cost, positions
from core.goalview import Limit, binding
from core.knobs import DRAFT_WIDTH, by_role
from core.summary import Summary
from core.evidence import Evidence

HYPOTHESES: tuple[str, ...] = NAMES
SEPARATION = 0.15  # two supported hypotheses closer than this cannot be told apart from queues alone
__all__ = ["BUDGET_FULL", "CAP_FULL", "HYPOTHESES", "LOAD_HEADROOM", "OPEN_LOW", "SUPPORTED", "Diagnosis",
           "Hypothesis", "client_limit", "decode_at_limit", "decode_demand", "decode_full", "diagnose",
           "prefill_limit"]


def diagnose(summary: Summary | None, evidence: Evidence | dict[str, Any] | None, limits: tuple[Limit, ...] | None,
             knobs: dict[str, Any] | None = None, ruled_out: frozenset[str] | set[str] = frozenset()) -> Diagnosis:
    """Rank the named explanations of where throughput is lost, from queue and batch evidence; the latency rules
    read the limit that binds at this run (`limits`: the goal's, GoalView.limits); `ruled_out` names hypotheses a
    move from this station already tested negative: the queue they explain no longer argues against the load as
    the limit (what a negative rules out)."""
    ev = evidence if isinstance(evidence, Evidence) else Evidence.model_validate(evidence or {})  # a digest record
    knobs = knobs or {}
    bound = binding(tuple(limits or ()), summary)
    ctx = Ctx(summary=summary, ev=ev, limit=bound, knobs=knobs, ruled_out=frozenset(ruled_out) - {"latency_bound"})
    head = latency_headroom(ctx)
    ctx = Ctx(summary=summary, ev=ev, limit=bound, knobs=knobs, ruled_out=ctx.ruled_out, headroom=head)
    hyps = [r.score(ctx) for r in RULES]
    # where the server loses throughput (profiles separate these); latency and load headroom are about the load
    throughput = [h for r, h in zip(RULES, hyps) if r.separable]
    ranked = sorted(throughput, key=lambda h: -h.likelihood)
    profile, why = False, None
    queues_seen = ev.prefill_waiting_mean is not None or ev.decode_waiting_mean is not None
    if ranked[0].likelihood < SUPPORTED and ranked[0].likelihood >= OPEN_LOW:
        profile, why = True, f"no explanation is supported by the queues; {ranked[0].name} is only open"
    elif ranked[0].likelihood >= SUPPORTED and ranked[1].likelihood >= ranked[0].likelihood - SEPARATION:
        profile, why = True, f"queues cannot separate {ranked[0].name} from {ranked[1].name}"
    elif not queues_seen and ranked[0].likelihood < SUPPORTED:
        profile, why = True, "no queue evidence was collected"
    limit, limit_why, fill = prefill_limit(ev, knobs)
    client, client_why = client_limit(summary)
    k = int(by_role(knobs, DRAFT_WIDTH) or 0)
    return Diagnosis(hypotheses=hyps, propose_profile=profile, profile_reason=why, headroom=head,
                     binding=bound.key if bound else None, binding_words=bound.words if bound else None,
                     binding_side=bound.side if bound else None,
                     prefill_limit=limit, prefill_limit_why=limit_why, prefill_budget_fill=fill, client_limit=client,
                     client_limit_why=client_why, decode_demand=decode_demand(ev), spec_positions=positions(ev),
                     draft_cost=draft_cost(ev, k), imbalance_loss=imbalance_loss(ev)[0],
                     transfer_wait=(transfer_wait(ev) or (None,))[0], prefill_busy=_busy(ev, "prefill"))


def _busy(ev: Evidence, role: str) -> float | None:
    d = ev.breakdown.role(role)
    return d.busy_share if d is not None else None


def wants_profile(diag: Diagnosis | None, card: CandidateCard, history: History) -> bool:
    """Profile only when the queues cannot separate the explanations, and once per parent station."""
    if diag is None or not diag.propose_profile or card.stage == "baseline" and not history.outcomes:
        return False
    return not any(o.card.profile_capture and o.card.parent_knobs_hash == card.parent_knobs_hash for o in history.outcomes)

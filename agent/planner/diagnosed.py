"""The diagnosis the rules make together: each named hypothesis's likelihood with the evidence for and against it,
and the evidence figures the rules' value models read. A leaf of the planner (pydantic only): the rules, the history
and the diagnosis (agent/planner/diagnosis.py, which makes one) all read it.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# likelihood bands, coarse on purpose (the planner only ranks explanations): supported >= 0.6 > open >= 0.3 > weak
SUPPORTED, OPEN_LOW = 0.6, 0.3  # a judgement; from OPEN_LOW up a negative counts as ruling something out (value.py)


class Hypothesis(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    likelihood: float = Field(ge=0.0, le=1.0)
    evidence_for: list[str] = Field(default_factory=list)
    evidence_against: list[str] = Field(default_factory=list)

    @property
    def status(self) -> str:
        if self.likelihood >= SUPPORTED:
            return "supported"
        return "open" if self.likelihood >= OPEN_LOW else "weak"


class Diagnosis(BaseModel):
    model_config = ConfigDict(frozen=True)
    hypotheses: list[Hypothesis]
    propose_profile: bool = False
    profile_reason: str | None = None
    headroom: float | None = None  # 1 - figure / limit of the binding latency limit (the least slack)
    binding: str | None = None  # that limit's key (core/goalview.py Limit.key)
    binding_words: str | None = None  # its figure in words ("TTFT p99")
    binding_side: Literal["decode", "prefill", "both"] | None = None  # which side's knobs move it (E2E: both)
    # which prefill batch limit binds (batch composition evidence): "token_budget" when batches already fill
    # the token budget (a higher request cap cannot add tokens), "request_cap" when they carry the cap's
    # requests with budget to spare; None when the evidence does not say
    prefill_limit: Literal["token_budget", "request_cap"] | None = None
    prefill_limit_why: str | None = None
    prefill_budget_fill: float | None = None  # mean prefill batch tokens / token budget
    # which client limit binds, as a knob role: "arrival_rate" (QPS ≈ r with free concurrency slots: a higher C adds
    # nothing) or "client_cap" (in flight ≈ C: a higher r only queues at the sender); None when neither clearly
    client_limit: Literal["arrival_rate", "client_cap"] | None = None
    client_limit_why: str | None = None
    # requests per decode instance that want to run (running + waiting) when decode sits at its batch limit:
    # the queue sizes how far the limit should move, not only which way
    decode_demand: float | None = None
    spec_positions: list[float] | None = None  # acceptance per draft position (share of drafts)
    draft_cost: float | None = None  # one draft position's time relative to a decode step (breakdown draft_s)
    draft_cost_why: str | None = None  # where draft_cost comes from when not the breakdown (a fit over widths)
    imbalance_loss: float | None = None  # share of device time lost to expert imbalance
    transfer_wait: float | None = None  # share of the decode side's requests waiting for their KV transfer
    prefill_busy: float | None = None  # busy share of the prefill instances' time (breakdown)

    def get(self, name: str) -> Hypothesis:
        return next(h for h in self.hypotheses if h.name == name)

    def likelihood(self, name: str) -> float:
        return self.get(name).likelihood

    @property
    def leading(self) -> Hypothesis:
        return max(self.hypotheses, key=lambda h: h.likelihood)

    def text(self) -> str:
        lines = []
        for h in sorted(self.hypotheses, key=lambda h: -h.likelihood):
            lines.append(f"{h.name} [{h.status} {h.likelihood:.2f}]")
            lines += [f"  + {e}" for e in h.evidence_for]
            lines += [f"  - {e}" for e in h.evidence_against]
        if self.propose_profile:
            lines.append(f"profile capture: {self.profile_reason}")
        return "\n".join(lines)

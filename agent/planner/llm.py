"""The LLM planner: an OpenAI-compatible model writes the diagnosis and proposes one change.

The model's answer is pydantic-validated structured output; the card built from it passes the same
`checks` as the deterministic planner's. On an invalid proposal or any LLM error the deterministic
planner answers instead and the reason is recorded (Plan.fallback). Baselines, confirmations and stop
rules stay deterministic: the model only chooses the next screen.
"""
from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

import prompts
from agent.planner.candidates import build_card, rule_for
from agent.planner.cards import CARD_HOURS_DIGITS
from agent.planner.checks import check, estimate, retry_note, said
from agent.planner.history import History
from agent.planner.rules import prompt_lines
from agent.planner.deterministic import DeterministicPlanner, diagnosis_for
from agent.planner.plan import Plan, PlanRow
from agent.planner.value import value_of
from core.knobs import KnobError, catalog

LLM_TIMEOUT_S = 60.0  # seconds an LLM call may take before it fails and the deterministic planner answers (judgement)


class LLMHypothesis(BaseModel):
    name: str
    likelihood: float
    evidence_for: list[str]
    evidence_against: list[str]


class Proposal(BaseModel):
    """The structured output asked of the model."""

    model_config = ConfigDict(extra="forbid")
    hypotheses: list[LLMHypothesis]
    knob: str
    value: str = Field(description="the new value, written as it appears in the search space")
    hypothesis: str
    mechanism: str
    decision: str
    expected_effect: str
    negative_rules_out: str


def _fmt(v: Any) -> str:
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return json.dumps(v) if not isinstance(v, str) else v


def system_prompt() -> str:
    """The system prompt, its hypotheses built from the rule list (agent.planner.rules.RULES)."""
    return prompts.render("system", rules=prompt_lines())


def render_prompt(history: History) -> list[dict[str, str]]:
    goal = history.goal
    ref = history.latest_valid(history.best_knobs)
    diag = diagnosis_for(history)
    outcomes = "\n".join(f"- {o.card.title()} -> {o.verdict}/{o.decision}: {o.reason}" for o in history.outcomes) or "none"
    negatives = "\n".join(f"- {n.knob}={_fmt(n.value)} (parent {n.parent_knobs_hash}, data {n.data_version}): {n.reason}"
                          for n in history.negatives) or "none"
    user = prompts.render(
        "propose", objective=goal.objective.model_dump_json(), scenario=goal.scenario,
        constraints=goal.constraints.model_dump_json(exclude_none=True), screen_n=goal.protocol.screen_n,
        confirm_n=goal.protocol.confirm_n,
        best_knobs=json.dumps({k: _fmt(v) for k, v in history.best_knobs.items()}, sort_keys=True),
        evidence_n=ref.card.n if ref else "-",
        summary=ref.summary.model_dump_json(exclude={"definitions"}) if ref and ref.summary else "none",
        evidence=json.dumps(ref.evidence.model_dump(mode="json"), default=str) if ref else "none",
        diagnosis=diag.text() if diag else "none yet",
        space="\n".join(f"{k}: {[_fmt(v) for v in vs]}" for k, vs in goal.space().items()),
        outcomes=outcomes, negatives=negatives, budget_left=f"{history.budget_left_card_hours:.2f}",
        experiments_left=history.experiments_left)
    return [{"role": "system", "content": system_prompt()}, {"role": "user", "content": user}]


def _value_from_text(knob: str, text: str, space: dict[str, tuple[Any, ...]]) -> Any:
    """Map the model's text onto one of the space's values (so 2 and "2" are the same proposal)."""
    k = catalog().get(knob)
    for v in space.get(knob, ()):
        if _fmt(v) == text.strip() or str(v) == text.strip():
            return v
    return k.coerce(text.strip())


def _direction(knob: str, old: Any, new: Any) -> str:
    k = catalog().get(knob)
    if k.type in ("enum", "bool"):
        return "up" if new != k.default else "down"
    if new is None or old is None:  # None = unlimited, above every number
        return "up" if new is None else "down"
    return "up" if new > old else "down"


class LLMPlanner:
    name = "llm"

    def __init__(self, base_url: str, model: str = "tuneloop-planner", api_key: str = "not-needed",
                 timeout_s: float = LLM_TIMEOUT_S, max_retries: int = 1):
        from openai import OpenAI  # deferred: openai, only when an LLM endpoint is configured

        self.client = OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries)
        self.model = model
        self.fallback = DeterministicPlanner()

    def ask(self, history: History) -> Plan:
        base = self.fallback.ask(history)
        # Baselines, confirmations of promising screens, recoveries and stops are protocol, not choices: they stay
        # deterministic. The model chooses the move (at the stage the protocol gives it: a screen, or confirm N
        # at once where the deterministic planner would skip the screen).
        if base.card is None or not base.move:
            return base
        try:
            proposal = self._propose(history)
        except Exception as e:  # any LLM failure: network, HTTP status, refusal, unparsable output
            return self._fall_back(base, f"LLM error: {type(e).__name__}: {e}")
        try:
            new = _value_from_text(proposal.knob, proposal.value, history.goal.space())
            card = build_card(history.goal_id, history.goal.scenario, history.best_knobs, proposal.knob, new,
                              stage=base.card.stage, n=base.card.n, planner="llm",
                              hypothesis=proposal.hypothesis, mechanism=proposal.mechanism,
                              decision=proposal.decision, expected_effect=proposal.expected_effect,
                              negative_rules_out=proposal.negative_rules_out)
        except (KnobError, ValueError) as e:
            return self._fall_back(base, f"invalid proposal {proposal.knob}={proposal.value!r}: {e}")
        refusals = check(card, history)
        if refusals:
            return self._fall_back(base, f"proposal {card.title()} refused: " + said(refusals))
        cost = estimate(card, history)
        v = value_of(card, rule_for(proposal.knob, _direction(proposal.knob, card.change.old, new)), base.diagnosis, cost, history.budget_left_card_hours)
        card = card.model_copy(update={"score": v.value, "est_card_hours": round(cost, CARD_HOURS_DIGITS),
                                       "note": retry_note(card, history)})
        return Plan(card=card, diagnosis=base.diagnosis, ranked=[PlanRow.of(card.title(), v.value, "proposed by the LLM")],
                    llm_hypotheses=[h.model_dump() for h in proposal.hypotheses])

    def _propose(self, history: History) -> Proposal:
        resp = self.client.chat.completions.parse(model=self.model, messages=render_prompt(history),  # type: ignore[arg-type]
                                                  response_format=Proposal, temperature=0)
        msg = resp.choices[0].message
        if msg.parsed is None:
            raise ValueError(f"no structured proposal (refusal: {msg.refusal!r})")
        return msg.parsed

    @staticmethod
    def _fall_back(base: Plan, why: str) -> Plan:
        return base.model_copy(update={"fallback": why})

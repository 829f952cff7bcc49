"""Every human-approval pause of the loop lives here (and only here).

`authorise` decides auto / ask / deny from the goal's authorisation table and the budget. "ask" is a
LangGraph `interrupt()` with the card as payload; nothing with a side effect happens before it (a
resumed node re-runs from its first line), and an approval already in the store is never asked again.
"""
from __future__ import annotations

from typing import Any

from langgraph.types import interrupt

from state.authorisation import decide
from state.errors import Conflict


def action_classes(card: dict[str, Any]) -> list[str]:
    classes = [card.get("cost_class") or "restart"]
    if card.get("quality_risk"):
        classes.append("quality_risk")
    if card.get("profile_capture"):
        classes.append("profile")
    return classes


def permission(card: dict[str, Any], table: dict[str, str], budget: Any, estimate: float) -> tuple[str, str]:
    d = decide(action_classes(card), table, budget.card_hours_left, estimate,
               experiments_left=budget.experiments_left, deadline_passed=budget.deadline_passed)
    return d.permission, "; ".join(d.reasons)


def authorise(store: Any, goal_id: str, candidate_id: int, card: dict[str, Any], card_hash: str, *,
              auto_approve: bool, who: str, estimate: float) -> tuple[str, str]:
    """('approve' | 'reject' | 'deny', why). May interrupt the graph to ask a person."""
    prior = store.approval(candidate_id)
    if prior is not None:  # given before a restart (or through the API): never ask again
        return prior.decision, f"{prior.decision}d by {prior.who}"
    goal = store.get_goal(goal_id)
    perm, why = permission(card, goal.spec.authorisation, store.budget(goal_id), estimate)
    if perm == "deny":
        return "deny", why
    if perm == "ask" and not auto_approve:
        answer = interrupt({"candidate_id": candidate_id, "card_hash": card_hash, "card": card, "why": why})
        # --- side effects only after the interrupt returned ---
        decision = (answer or {}).get("decision", "reject") if isinstance(answer, dict) else str(answer)
        approver = (answer or {}).get("who", "person") if isinstance(answer, dict) else "person"
        reason = (answer or {}).get("reason") if isinstance(answer, dict) else None
        return _record(store, candidate_id, card_hash, "approve" if decision == "approve" else "reject",
                       approver, reason)
    approver = who if perm == "auto" else f"{who} (--auto-approve)"
    return _record(store, candidate_id, card_hash, "approve", approver, why)


def _record(store: Any, candidate_id: int, card_hash: str, decision: str, who: str, reason: str | None) -> tuple[str, str]:
    try:
        if decision == "approve":
            store.approve(candidate_id, card_hash, who, reason)
        else:
            store.reject(candidate_id, card_hash, who, reason)
    except Conflict:  # decided concurrently (e.g. through the API): the stored decision stands
        prior = store.approval(candidate_id)
        if prior is not None:
            return prior.decision, f"{prior.decision}d by {prior.who}"
        raise
    return decision, f"{decision}d by {who}"

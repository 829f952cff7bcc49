"""Every human-approval pause of the loop lives here (and only here).

`authorise` decides, when a card is about to run (not only when it was first asked), from the goal's
authorisation table, the budget (with the extensions people granted), the deadline and the approvals in
the store. "ask" is a LangGraph `interrupt()` with the card (or the budget extension it needs) as payload;
nothing with a side effect happens before it (a resumed node re-runs from its first line). An approval
already in the store is not asked again while the budget and deadline it was given under still hold.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from langgraph.types import interrupt

from agent.planner import change_words

from state.approvals import PAST
from state.authorisation import decide
from state.errors import Conflict
from state.snapshots import GivenBy

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store

Outcome = Literal["approve", "reject", "deny", "stop", "spent", "reask"]


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


def over_budget(budget: Any, estimate: float) -> list[str]:
    """Why this card would cross the budget (card-hours, experiments); empty when it fits."""
    out = []
    if estimate > budget.card_hours_left + 1e-12:
        out.append(f"estimated {estimate:.3f} card-hours exceeds the {max(budget.card_hours_left, 0):.3f} left")
    if budget.experiments_left < 1:
        out.append("no experiments left in the budget")
    return out


def extension_needed(budget: Any, estimate: float) -> tuple[float, int]:
    """(card-hours, experiments) to add so that this card fits: card-hours rounded up to 0.01."""
    hours = max(0.0, estimate - budget.card_hours_left)
    return (math.ceil(hours * 100) / 100 if hours > 0 else 0.0), max(0, 1 - budget.experiments_left)


def covers(prior: Any, budget: Any) -> bool:
    """An approval holds while the deadline it was given before has not passed since."""
    if not budget.deadline_passed:
        return True
    return bool(prior.context and prior.context.get("deadline_passed"))


def _title(card: dict[str, Any]) -> str:
    what = change_words(card) or "measure the parent station"
    return f"{card.get('stage')} N={card.get('n')}: {what}"


def authorise(store: Store, goal_id: str, candidate_id: int, card: dict[str, Any], card_hash: str, *,
              auto_approve: bool, who: str, estimate: float, instructed_by: str | None = None) -> tuple[Outcome, str]:
    """(approve | reject | deny | stop | spent | reask, why). May interrupt the graph to ask a person.

    deny: the authorisation table forbids the card's action class (the loop remembers it like a rejection);
    spent: the budget cannot pay for it and no extension can be had (denied by the table, or --auto-approve,
    which never extends a budget): the goal is done; stop: a person refused the extension, or the deadline passed
    and the table denies extensions: the goal stops; reask: an approval given before the deadline, which has
    passed since (the loop asks again with a fresh card)."""
    goal = store.get_goal(goal_id)
    table = goal.spec.authorisation
    table_only = decide(action_classes(card), table, None, None)
    if table_only.permission == "deny":
        return "deny", "; ".join(table_only.reasons)
    prior = store.approval(candidate_id)
    if prior is not None and prior.decision == "reject":
        return "reject", f"rejected by {prior.who}" + (f": {prior.reason}" if prior.reason else "")
    budget = store.budget(goal_id)
    over = over_budget(budget, estimate)
    if over and instructed_by is None:  # a person's "one more round" is their say-so for that round's cost
        ext = table.get("budget_extension", "ask")
        why = f"{_title(card)}: " + "; ".join(over)
        if ext == "deny":
            return "spent", f"budget spent: {why}; budget_extension -> deny"
        cand = store.get_candidate(candidate_id)
        refused = [x for x in store.extensions(goal_id) if x.decision == "refuse" and x.created_at >= cand.created_at]
        if refused:
            r = refused[-1]
            return "stop", f"budget extension refused by {r.who}" + (f": {r.reason}" if r.reason else "") + f" ({why})"
        if auto_approve:
            return "spent", f"budget spent: {why}; --auto-approve never extends a budget (a person can grant one)"
        hours, runs = extension_needed(budget, estimate)
        answer = interrupt({"kind": "budget_extension", "candidate_id": candidate_id, "card_hash": card_hash,
                            "card": card, "card_hours": hours, "experiments": runs,
                            "why": f"{why}: needs a budget extension of {hours:.2f} card-hours and {runs} experiment(s)"})
        # --- side effects only after the interrupt returned (`tuneloop run` resumed with an answer) ---
        a = answer if isinstance(answer, dict) else {"decision": str(answer)}
        by = a.get("who", "person")
        if a.get("decision") in ("grant", "approve"):
            store.extend_budget(goal_id, float(a.get("card_hours", hours)), int(a.get("experiments", runs)), by,
                                a.get("reason"))
            return authorise(store, goal_id, candidate_id, card, card_hash, auto_approve=auto_approve, who=who,
                             estimate=estimate, instructed_by=instructed_by)
        store.refuse_extension(goal_id, by, a.get("reason"))
        return "stop", f"budget extension refused by {by}" + (f": {a['reason']}" if a.get("reason") else "")
    if prior is not None:  # approved before (a restart, the API, the CLI): holds unless the deadline passed since
        if covers(prior, budget):
            return "approve", f"approved by {prior.who}"
        return "reask", f"approval by {prior.who} was given before the deadline, which has passed: asked again"
    if instructed_by is not None:
        return _record(store, candidate_id, card_hash, "approve", instructed_by, "asked for by an instruction")
    perm, why = permission(card, table, budget, estimate)
    if perm == "ask" and not auto_approve:
        answer = interrupt({"kind": "approval", "candidate_id": candidate_id, "card_hash": card_hash, "card": card,
                            "why": why})
        # --- side effects only after the interrupt returned ---
        decision = (answer or {}).get("decision", "reject") if isinstance(answer, dict) else str(answer)
        approver = (answer or {}).get("who", "person") if isinstance(answer, dict) else "person"
        reason = (answer or {}).get("reason") if isinstance(answer, dict) else None
        return _record(store, candidate_id, card_hash, "approve" if decision == "approve" else "reject",
                       approver, reason)
    if perm == "deny":  # the deadline passed and budget_extension is deny
        return "stop", f"{_title(card)} not run: {why}"
    approver = who if perm == "auto" else f"{who} (--auto-approve)"
    return _record(store, candidate_id, card_hash, "approve", approver, why, "table" if perm == "auto" else "flag")


def _record(store: Store, candidate_id: int, card_hash: str, decision: str, who: str, reason: str | None,
            given_by: GivenBy = "person") -> tuple[str, str]:
    """`given_by`: who gave an approval: a person (through any channel, or by an instruction), the authorisation
    table ("table"), --auto-approve ("flag")."""
    try:
        if decision == "approve":
            store.approve(candidate_id, card_hash, who, reason, given_by)
        else:
            store.reject(candidate_id, card_hash, who, reason)
    except Conflict:  # decided concurrently (e.g. through the API): the stored decision stands
        prior = store.approval(candidate_id)
        if prior is not None:
            return prior.decision, f"{PAST[prior.decision]} by {prior.who}"
        raise
    return decision, f"{PAST[decision]} by {who}" + (f": {reason}" if reason and decision == "reject" else "")

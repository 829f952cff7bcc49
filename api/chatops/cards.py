"""An experiment card as people see it in a chat app: the same fields the dashboard shows (api/dashboard),
rendered once as labelled rows and then as Slack Block Kit or a Feishu/Lark interactive card (JSON 2.0).

The buttons carry `<candidate id>:<card hash>` (Slack) or {candidate_id, card_hash} (Feishu): a click decides
exactly the card that was shown, and a card that changed since is refused by the store (Stale).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.planner import change_words
from agent.loop.progress import card_estimate, ranking
from agent.loop.record import card_of, frozen_stations
from core.goalview import GoalView, effect
from core.ledger import prediction_words
from core.summary import Summary
from core.escape import feishu as feishu_esc
from core.escape import slack as esc  # the one Slack escaping: these cards, the replies and the webhook

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store

APPROVE, REJECT = "tuneloop_approve", "tuneloop_reject"  # Slack action ids
REASON_BLOCK, REASON_ACTION = "tuneloop_reason", "reason"  # the reason input (message and modal)
MODAL = "tuneloop_reject"  # the reject modal's callback id
_VALUE = re.compile(r"^(\d{1,12}):([0-9a-f]{16})$")


@dataclass(frozen=True)
class CardView:
    candidate_id: int
    goal_id: str
    card_hash: str  # the hash as shown: what a click is bound to
    title: str
    rows: tuple[tuple[str, str], ...]


def button_value(candidate_id: int, card_hash: str) -> str:
    return f"{candidate_id}:{card_hash}"


def parse_value(value: Any) -> tuple[int, str] | None:
    """(candidate id, card hash) from a button's value; None when it is not one of ours."""
    m = _VALUE.match(value) if isinstance(value, str) else None
    return (int(m.group(1)), m.group(2)) if m else None


def _pct(x: Any) -> str:
    return effect(float(x)) or ""  # beyond +-1000 % the factor: such a percentage says nothing


def _effect(name: str, eff: dict[str, Any] | None) -> str | None:
    if not isinstance(eff, dict) or "value" not in eff:
        return None
    lo, hi = eff.get("lo", eff["value"]), eff.get("hi", eff["value"])
    return f"{name}: {_pct(eff['value'])} (interval {_pct(lo)} to {_pct(hi)})"


def rows(card: dict[str, Any], card_hash: str, est: float | None, cost_class: str | None,
         rank: Any, view: GoalView | None = None, base: Summary | None = None) -> list[tuple[str, str]]:
    """The labelled rows of a card (pure): what changes (every change of a pair or a jump), why, the predicted
    figures with their interval in the goal's own terms (`view`; against `base`, the parent's run, where known) beside
    the parent's measured ones, the evidence it rests on, its cost and rank, and the hash a decision is bound to."""
    what = change_words(card, arrow="→", fmt=str) or "nothing: measure the parent station itself (a reference)"
    if card.get("coupling"):
        what += f" (a coupled pair: {card['coupling']})"
    parent = ", ".join(f"{k}={v}" for k, v in sorted((card.get("parent_knobs") or {}).items()))
    pred = card.get("prediction") or {}
    predicted = prediction_words(pred, view, base) if view is not None else [
        x for x in (_effect(str(pred.get("objective") or "objective"), pred.get("objective_effect")),
                    _effect(str(pred.get("slo") or "SLO figure"), pred.get("slo_effect"))) if x]
    evidence = [str(pred["basis"])] if pred.get("basis") else []
    hyps = (card.get("diagnosis") or {}).get("hypotheses") if isinstance(card.get("diagnosis"), dict) else None
    mine = next((h for h in hyps or [] if isinstance(h, dict) and h.get("name") == card.get("hypothesis")), None)
    if mine is not None:  # what the diagnosis of the parent's run found for (and against) this card's hypothesis
        evidence += [f"for {mine['name']}: {e}" for e in (mine.get("evidence_for") or [])[:3]]
        evidence += [f"against: {e}" for e in (mine.get("evidence_against") or [])[:2]]
    evidence += [f"decision it affects: {card.get('decision') or '—'}",
                 f"a negative rules out: {card.get('negative_rules_out') or '—'}"]
    if getattr(rank, "rank", None):
        ranked = f"{rank.rank} of {rank.of} weighed"
    elif getattr(rank, "of", 0):
        ranked = f"not in the top {rank.of} recorded"
    else:
        ranked = "the only card (no alternatives weighed)"
    if getattr(rank, "why", None):
        ranked += f" — {rank.why}"
    cost = (f"{est:.2f} card-hours" if est is not None else "— card-hours")
    cost += f" ({cost_class or card.get('cost_class') or '?'})"
    if card.get("quality_risk"):
        cost += "; a quality risk: the quality check runs before it can become the best"
    out = [("what changes (knobs)", what), ("parent station", parent or "—"),
           ("hypothesis", card.get("hypothesis") or "—"), ("mechanism", card.get("mechanism") or "—"),
           ("predicted effect", "; ".join(predicted) or "no numeric prediction"),
           ("the parent measured", view.figures_words(base) if view is not None and base is not None else "—"),
           ("expected (in words)", card.get("expected_effect") or "—"), ("evidence", "; ".join(evidence)),
           ("cost", cost), ("rank", ranked)]
    if card.get("prescreen"):
        out.append(("pre-screen", str(card["prescreen"])))
    if card.get("note"):
        out.append(("note", str(card["note"])))
    out.append(("card hash", card_hash))
    return out


def view(store: Store, candidate_id: int, card_hash: str | None = None) -> CardView:
    """The card of a candidate from the store, shown with `card_hash` (the hash the loop asked about; the
    stored one by default)."""
    c = store.get_candidate(candidate_id)
    h = card_hash or c.card_hash
    card = c.card
    what = change_words(card, fmt=str) or "reference run"
    title = f"Candidate {c.id}: {card.get('stage')} N={card.get('n')} {what} [{c.cost_class or '?'}]"
    est = card_estimate(store, c.goal_id, card)
    return CardView(candidate_id=c.id, goal_id=c.goal_id, card_hash=h, title=title,
                    rows=tuple(rows(card, h, est, c.cost_class, ranking(card), store.get_goal(c.goal_id).spec.view(),
                                    parent_summary(store, c.goal_id, card))))


def parent_summary(store: Store, goal_id: str, card: dict[str, Any]) -> Summary | None:
    """The summary of the parent station's latest valid run at the card's N (else at any N): what the card's
    prediction is relative to, and what a person compares it with."""
    parent = frozen_stations(store, goal_id).get(card_of(card).parent_knobs_hash)
    n_of = {r.id: r.n for r in store.runs(goal_id)}
    found = [(n_of.get(r.run_id), r.result.summary) for r in store.results(goal_id)
             if parent and r.valid and r.station_hash == parent and r.result.summary is not None]
    same = [s for n, s in found if n == card.get("n")]
    return (same or [s for _, s in found] or [None])[-1]


def outcome_text(decision: str, who: str, reason: str | None, card_hash: str) -> str:
    """One line for the message once decided ('who' as recorded: "alice (slack)")."""
    verb = "Approved" if decision == "approve" else "Rejected"
    return f"{verb} by {who}, bound to card hash {card_hash}" + (f": {reason}" if reason else "")


@dataclass(frozen=True)
class Decided:
    """A card once decided, as a chat shows it: the decision (which colours the card) and its line."""

    decision: str  # approve | reject
    text: str

    @classmethod
    def of(cls, decision: str, who: str, reason: str | None, card_hash: str) -> "Decided":
        return cls(decision, outcome_text(decision, who, reason, card_hash))


# ---- Slack Block Kit ---------------------------------------------------------------------------------------

def slack_blocks(v: CardView, outcome: str | None = None) -> list[dict[str, Any]]:
    """The card as Block Kit: a section per row; while undecided a reason input and Approve / Reject buttons,
    once decided the outcome in their place."""
    blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": v.title[:150]}}]
    for label, value in v.rows:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"*{label}:* {esc(value)}"[:3000]}})
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"goal `{esc(v.goal_id)}` · "
                                                    f"candidate {v.candidate_id} · card hash `{v.card_hash}`"}]})
    if outcome is not None:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"*{esc(outcome)}*"[:3000]}})
        return blocks
    value = button_value(v.candidate_id, v.card_hash)
    blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "*The loop waits for your decision.*"}})
    blocks.append({"type": "input", "block_id": REASON_BLOCK, "optional": True,
                   "label": {"type": "plain_text", "text": "Reason (required to reject)"},
                   "element": {"type": "plain_text_input", "action_id": REASON_ACTION}})
    blocks.append({"type": "actions", "block_id": "tuneloop_decide", "elements": [
        {"type": "button", "action_id": APPROVE, "style": "primary", "value": value,
         "text": {"type": "plain_text", "text": "Approve"}},
        {"type": "button", "action_id": REJECT, "style": "danger", "value": value,
         "text": {"type": "plain_text", "text": "Reject"}}]})
    return blocks


def slack_modal(v: CardView, metadata: str) -> dict[str, Any]:
    """The reject modal (views.open): the reason is required; `metadata` says which message to update."""
    return {"type": "modal", "callback_id": MODAL, "private_metadata": metadata,
            "title": {"type": "plain_text", "text": f"Reject candidate {v.candidate_id}"[:24]},
            "submit": {"type": "plain_text", "text": "Reject"}, "close": {"type": "plain_text", "text": "Cancel"},
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": esc(v.title)[:3000]}},
                       {"type": "input", "block_id": REASON_BLOCK, "label": {"type": "plain_text", "text": "Why?"},
                        "element": {"type": "plain_text_input", "action_id": REASON_ACTION, "multiline": True}}]}


# ---- Feishu / Lark interactive card (JSON 2.0) -----------------------------------------------------------------

def _button(v: CardView, decision: str, label: str, kind: str) -> dict[str, Any]:
    return {"tag": "button", "name": decision, "type": kind, "form_action_type": "submit",
            "text": {"tag": "plain_text", "content": label},
            "behaviors": [{"type": "callback", "value": {"tuneloop": decision, "candidate_id": str(v.candidate_id),
                                                         "card_hash": v.card_hash}}]}


def feishu_card(v: CardView, outcome: Decided | None = None) -> dict[str, Any]:
    """The card as Feishu/Lark card JSON 2.0: markdown rows; while undecided a form with the reason input and
    Approve / Reject submit buttons (the callback carries the form's reason), once decided the outcome."""
    elements: list[dict[str, Any]] = [{"tag": "markdown", "content": f"**{label}**: {feishu_esc(value)}"}
                                      for label, value in v.rows]
    elements.append({"tag": "markdown", "content": f"goal {feishu_esc(v.goal_id)} · candidate {v.candidate_id}"})
    if outcome is not None:
        elements.append({"tag": "markdown", "content": f"**{feishu_esc(outcome.text)}**"})
    else:
        elements.append({"tag": "markdown", "content": "**The loop waits for your decision.**"})
        elements.append({"tag": "form", "name": "tuneloop_decide", "elements": [
            {"tag": "input", "name": REASON_ACTION,
             "placeholder": {"tag": "plain_text", "content": "Reason (required to reject)"}},
            _button(v, "approve", "Approve", "primary"), _button(v, "reject", "Reject", "danger")]})
    return {"schema": "2.0", "config": {"update_multi": True},
            "header": {"title": {"tag": "plain_text", "content": v.title},
                       "template": "blue" if outcome is None else "green" if outcome.decision == "approve" else "red"},
            "body": {"elements": elements}}

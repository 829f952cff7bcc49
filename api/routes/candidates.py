"""Candidates (experiment cards): list, get, approve, reject — each bound to the card's content hash."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from agent.loop.progress import card_estimate, ranking
from agent.loop.record import card_of, frozen_stations
from agent.loop.session import waiting_head
from api import actions
from api.auth import Approver, Viewer
from api.chatops.cards import parent_summary
from api.deps import ServiceDep, StoreDep, ViaDep
from api.schemas import ApprovalOut, CandidateOut, DecisionIn, RejectIn

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store

router = APIRouter(tags=["candidates"])
CONFLICT = {409: {"description": "already decided (one decision per card), or the card changed since it was shown"}}


def asked(store: Store, goal_id: str) -> dict[int, str]:
    """Candidate id -> why the loop asked a person about it (its latest ask), without the 'waiting for' head."""
    out: dict[int, str] = {}
    for d in store.decisions(goal_id, ("ask",)):
        if d.candidate_id is not None:
            head = "" if (d.data or {}).get("kind") != "budget_extension" else "budget extension needed: "
            # the ask's text is agent.loop.session.waiting_reason's: its head (rebuilt from the same data), then why
            out[d.candidate_id] = head + d.text.removeprefix(f"{waiting_head(d.data or {})}: ")
    return out


def candidate_out(c: Any, frozen: dict[str, str], waiting: set[int] | None = None, store: Store | None = None,
                  asks: dict[int, str] | None = None) -> CandidateOut:
    """A card as shown, its own and its parent's station named by the frozen hash `/stations` resolves
    (`frozen`: agent.loop.record.frozen_stations); with `store`, an estimate is computed where the planner gave
    none and the parent's measured figures are read (for cards a person is asked about); `asks`: why the loop asked
    about each card (`asked`)."""
    est = card_estimate(store, c.goal_id, c.card) if store is not None else c.card.get("est_card_hours")
    base = parent_summary(store, c.goal_id, c.card) if store is not None else None
    card = card_of(c.card)
    return CandidateOut(id=c.id, goal_id=c.goal_id, card=c.card, card_hash=c.card_hash, status=c.status,
                        status_reason=c.status_reason, stage=c.stage, cost_class=c.cost_class,
                        awaiting_approval=c.id in (waiting or set()), est_card_hours=est, ranking=ranking(c.card),
                        station_hash=frozen.get(card.knobs_hash),
                        parent_station_hash=frozen.get(card.parent_knobs_hash), asked_why=(asks or {}).get(c.id),
                        parent_measured=store.get_goal(c.goal_id).spec.view().figures_words(base)
                        if store is not None and base is not None else None)


@router.get("/goals/{goal_id}/candidates", response_model=list[CandidateOut])
def list_candidates(goal_id: str, svc: ServiceDep, _: Viewer, awaiting: bool = False) -> list[CandidateOut]:
    """Every card of the goal, or (awaiting=true) only those the loop waits on."""
    waiting = {c.id for c in actions.pending(svc, goal_id)}
    cands = svc.store.candidates(goal_id)
    frozen, asks = frozen_stations(svc.store, goal_id), asked(svc.store, goal_id)
    return [candidate_out(c, frozen, waiting, svc.store if c.id in waiting else None, asks)
            for c in cands if not awaiting or c.id in waiting]


@router.get("/candidates/{candidate_id}", response_model=CandidateOut)
def get_candidate(candidate_id: int, svc: ServiceDep, _: Viewer) -> CandidateOut:
    c = svc.store.get_candidate(candidate_id)
    waiting = {p.id for p in actions.pending(svc, c.goal_id)}
    return candidate_out(c, frozen_stations(svc.store, c.goal_id), waiting, svc.store if c.id in waiting else None,
                         asked(svc.store, c.goal_id))


@router.get("/candidates/{candidate_id}/approval", response_model=ApprovalOut | None)
def get_approval(candidate_id: int, store: StoreDep, _: Viewer) -> Any:
    store.get_candidate(candidate_id)
    ap = store.approval(candidate_id)
    return ApprovalOut.model_validate(ap, from_attributes=True) if ap else None


@router.post("/candidates/{candidate_id}/approve", response_model=ApprovalOut, responses=CONFLICT)
def approve(candidate_id: int, body: DecisionIn, svc: ServiceDep, who: Approver, via: ViaDep) -> ApprovalOut:
    """Approve the card exactly as shown (`card_hash`); a second approval gets 409."""
    ap = actions.decide(svc, candidate_id, body.card_hash, "approve", who, body.reason, via=via)
    return ApprovalOut.model_validate(ap, from_attributes=True)


@router.post("/candidates/{candidate_id}/reject", response_model=ApprovalOut, responses=CONFLICT)
def reject(candidate_id: int, body: RejectIn, svc: ServiceDep, who: Approver, via: ViaDep) -> ApprovalOut:
    """Reject the card as shown, with a reason that says something in words (the loop records it, moves on)."""
    ap = actions.decide(svc, candidate_id, body.card_hash, "reject", who, body.reason, via=via)
    return ApprovalOut.model_validate(ap, from_attributes=True)

"""Candidates (experiment cards) and their approvals, bound to the card's content hash.

One decision per card: a unique row per candidate makes two concurrent approvals end with exactly one
winner (the other raises Conflict); approving a card that changed since it was shown raises Stale.
"""
from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from state import lifecycle
from state.db import Database, canon, dumps, get_row, snap, utcnow
from state.errors import Conflict, InvalidTransition, Stale
from state.snapshots import Approval, Candidate, GivenBy
from state.tables import ApprovalRow, CandidateRow, GoalRow
from state.reasons import check_reason

PAST = {"approve": "approved", "reject": "rejected"}


def card_hash(card: dict[str, Any]) -> str:
    """Content hash of an experiment card: an approval is bound to exactly these bytes."""
    return hashlib.sha256(dumps(card).encode()).hexdigest()[:16]


class Candidates:
    """Mixin for Store (needs `self._db`)."""

    _db: Database

    def add_candidate(self, goal_id: str, card: dict[str, Any], *, status: str = "proposed") -> Candidate:
        """Store a card; the same card (same content hash) for the same goal returns the stored one."""
        card = canon(card)
        h = card_hash(card)
        lifecycle.check("candidate", "proposed", status)
        now = utcnow()
        try:
            with self._db.write() as s:
                get_row(s, GoalRow, goal_id, "goal")
                old = s.execute(select(CandidateRow).where(CandidateRow.goal_id == goal_id,
                                                           CandidateRow.card_hash == h)).scalar_one_or_none()
                if old is not None:
                    return snap(Candidate, old)
                row = CandidateRow(goal_id=goal_id, card=card, card_hash=h, knob=card.get("knob"),
                                   value=card.get("value"), parent_hash=card.get("parent_hash") or card.get("parent"),
                                   cost_class=card.get("cost_class"), stage=card.get("stage", "screen"),
                                   status=status, created_at=now, updated_at=now)
                s.add(row)
                s.flush()
                return snap(Candidate, row)
        except IntegrityError:  # a concurrent writer stored the same card first
            with self._db.read() as s:
                row = s.execute(select(CandidateRow).where(CandidateRow.goal_id == goal_id,
                                                           CandidateRow.card_hash == h)).scalar_one()
                return snap(Candidate, row)

    def update_card(self, candidate_id: int, card: dict[str, Any]) -> Candidate:
        """Change a card before it is decided; any approval must then carry the new hash."""
        with self._db.write() as s:
            row = get_row(s, CandidateRow, candidate_id, "candidate", lock=True)
            if row.status not in ("proposed", "awaiting_approval"):
                raise InvalidTransition("candidate", row.status, "edited", ("proposed", "awaiting_approval"))
            row.card = canon(card)
            row.card_hash = card_hash(row.card)
            row.updated_at = utcnow()
            return snap(Candidate, row)

    def get_candidate(self, candidate_id: int) -> Candidate:
        with self._db.read() as s:
            return snap(Candidate, get_row(s, CandidateRow, candidate_id, "candidate"))

    def candidates(self, goal_id: str, status: str | None = None) -> list[Candidate]:
        q = select(CandidateRow).where(CandidateRow.goal_id == goal_id).order_by(CandidateRow.id)
        if status is not None:
            q = q.where(CandidateRow.status == status)
        with self._db.read() as s:
            return [snap(Candidate, r) for r in s.execute(q).scalars()]

    def set_candidate_status(self, candidate_id: int, status: str, reason: str | None = None) -> Candidate:
        with self._db.write() as s:
            row = get_row(s, CandidateRow, candidate_id, "candidate", lock=True)
            lifecycle.check("candidate", row.status, status)
            row.status, row.status_reason, row.updated_at = status, reason, utcnow()
            return snap(Candidate, row)

    def approve(self, candidate_id: int, card_hash: str, who: str, reason: str | None = None,
                given_by: GivenBy = "person") -> Approval:
        """`given_by`: "table" or "flag" where the loop approves a card itself (the authorisation table's `auto`,
        --auto-approve); a person's approval is "person"."""
        return self._decide(candidate_id, card_hash, who, "approve", reason, given_by)

    def reject(self, candidate_id: int, card_hash: str, who: str, reason: str | None = None) -> Approval:
        return self._decide(candidate_id, card_hash, who, "reject", reason)

    def _decide(self, candidate_id: int, shown_hash: str, who: str, decision: str, reason: str | None,
                given_by: GivenBy = "person") -> Approval:
        """One decision per card: a second (even concurrent) one raises Conflict; a changed card raises Stale.
        The approval keeps the budget and deadline it was given under (the loop asks again when they moved)."""
        context = self._approval_context(candidate_id)
        try:
            with self._db.write() as s:
                row = get_row(s, CandidateRow, candidate_id, "candidate", lock=True)
                prior = s.execute(select(ApprovalRow).where(ApprovalRow.candidate_id == candidate_id)).scalar_one_or_none()
                if prior is not None:
                    raise Conflict(f"candidate {candidate_id} was already {PAST[prior.decision]} by {prior.who}")
                if row.card_hash != shown_hash:
                    raise Stale(f"candidate {candidate_id} changed since it was shown "
                                f"(hash {shown_hash} -> {row.card_hash}); review it again")
                reason = check_reason(reason, required=decision == "reject")  # one validator for every channel
                lifecycle.check("candidate", row.status, "approved" if decision == "approve" else "rejected")
                row.status = "approved" if decision == "approve" else "rejected"
                row.status_reason, row.updated_at = reason, utcnow()
                ap = ApprovalRow(candidate_id=candidate_id, card_hash=shown_hash, decision=decision, who=who,
                                 reason=reason, context=context, given_by=given_by, created_at=utcnow())
                s.add(ap)
                s.flush()
                return snap(Approval, ap)
        except IntegrityError:
            raise Conflict(f"candidate {candidate_id} was decided concurrently by someone else") from None

    def _approval_context(self, candidate_id: int) -> dict[str, Any] | None:
        budget = getattr(self, "budget", None)
        if budget is None:
            return None
        b = budget(self.get_candidate(candidate_id).goal_id)
        return {"deadline_passed": b.deadline_passed, "card_hours_left": round(b.card_hours_left, 6),
                "experiments_left": b.experiments_left}

    def check_waiting(self, candidate_id: int) -> Candidate:
        """The candidate, if its goal is waiting for a person's decision on it; Conflict (409) otherwise."""
        cand = self.get_candidate(candidate_id)
        with self._db.read() as s:
            goal = get_row(s, GoalRow, cand.goal_id, "goal")
            status = goal.status
            decided = s.execute(select(ApprovalRow).where(ApprovalRow.candidate_id == candidate_id)).scalar_one_or_none()
        if decided is not None:
            raise Conflict(f"candidate {candidate_id} was already {PAST[decided.decision]} by {decided.who}")
        if status != "waiting" or cand.status not in ("proposed", "awaiting_approval"):
            raise Conflict(f"goal {cand.goal_id} is not waiting for candidate {candidate_id} "
                           f"(goal {status}, candidate {cand.status})")
        return cand

    def approval(self, candidate_id: int) -> Approval | None:
        with self._db.read() as s:
            row = s.execute(select(ApprovalRow).where(ApprovalRow.candidate_id == candidate_id)).scalar_one_or_none()
            return snap(Approval, row) if row else None


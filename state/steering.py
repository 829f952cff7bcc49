"""What people steer a goal with besides approvals and instructions: vetoes and budget extensions.

A veto is a decision, not a measurement: a rejected change (or one the authorisation table denies) from
one parent station is never proposed again under the same conditions (scenario, parent station, data
version, source identity). A budget extension adds card-hours and experiments to one goal's budget, only as a
person's answer to the loop's ask; a refusal is recorded too, so the loop that asked stops with its reason.
"""
from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from state.db import Database, get_row, snap, utcnow
from state.errors import Conflict
from state.lifecycle import WaitingFor
from state.memory import value_key
from state.reasons import check_reason
from state.snapshots import Conditions, Extension, Veto
from state.tables import DecisionRow, ExtensionRow, GoalRow, VetoRow
from core.errors import FieldError

MAX_EXTENSION_CARD_HOURS = 1e6
MAX_EXTENSION_EXPERIMENTS = 10_000


class Steering:
    """Mixin for Store (needs `self._db`)."""

    _db: Database

    # -- vetoes --------------------------------------------------------------------------------------
    def add_veto(self, goal_id: str, knob: str | None, value: Any, conditions: Conditions, *, who: str,
                 reason: str, source: str = "person", candidate_id: int | None = None) -> Veto:
        """Remember a rejected (or denied) change; the same candidate vetoed twice is stored once."""

        if source not in ("person", "authorisation"):
            raise FieldError("source", f"must be person or authorisation, got {source!r}")
        with self._db.write() as s:
            get_row(s, GoalRow, goal_id, "goal")
            if candidate_id is not None:
                old = s.execute(select(VetoRow).where(VetoRow.goal_id == goal_id,
                                                      VetoRow.candidate_id == candidate_id)).scalars().first()
                if old is not None:
                    return _veto(old)
            row = VetoRow(goal_id=goal_id, candidate_id=candidate_id, scenario=conditions.scenario, knob=knob,
                          value_key=value_key(knob, value) if knob is not None else None,
                          parent_hash=conditions.parent_hash or "", data_version=conditions.data_version,
                          source_identity=conditions.source_identity, source=source, who=who, reason=reason or "",
                          created_at=utcnow())
            s.add(row)
            s.flush()
            return _veto(row)

    def vetoes(self, goal_id: str) -> list[Veto]:
        with self._db.read() as s:
            rows = s.execute(select(VetoRow).where(VetoRow.goal_id == goal_id).order_by(VetoRow.id)).scalars()
            return [_veto(r) for r in rows]

    # -- budget extensions ---------------------------------------------------------------------------
    def extend_budget(self, goal_id: str, card_hours: float, experiments: int, who: str,
                      reason: str | None = None) -> Extension:
        """Add card-hours and/or experiments to a goal's budget whether or not the loop asked (both >= 0, at least
        one > 0): the store's own primitive; every person's channel answers the loop's ask (`answer_extension`)."""
        _check_amounts(card_hours, experiments)
        with self._db.write() as s:
            return self._extension(s, goal_id, "grant", float(card_hours), experiments, who, reason)

    def refuse_extension(self, goal_id: str, who: str, reason: str | None = None) -> Extension:
        """Record a refusal of an extension (the store's primitive; people answer through `answer_extension`)."""
        with self._db.write() as s:
            return self._extension(s, goal_id, "refuse", 0.0, 0, who, reason)

    def answer_extension(self, goal_id: str, decision: str, who: str, reason: str | None = None, *,
                         card_hours: float = 0.0, experiments: int | None = None) -> Extension:
        """A person's answer to the budget extension the loop asked for: "grant" (card-hours, and the experiments
        asked for unless given) or "refuse" (the goal stops with the reason). A budget grows only as such an answer:
        Conflict (409), nothing stored, when the goal waits for no extension, checked under the goal's row lock."""
        if decision not in ("grant", "refuse"):
            raise FieldError("decision", f"must be grant or refuse, got {decision!r}")
        with self._db.write() as s:
            goal = get_row(s, GoalRow, goal_id, "goal", lock=True)
            if goal.status != "waiting" or goal.waiting_for != WaitingFor.BUDGET_EXTENSION.value:
                raise Conflict(f"goal {goal_id} is not waiting for a budget extension ({goal.status}): nothing "
                               f"{'granted' if decision == 'grant' else 'refused'}; the loop asks when its budget "
                               "cannot pay for the next experiment")
            if decision == "refuse":
                return self._extension(s, goal_id, "refuse", 0.0, 0, who, reason)
            if experiments is None:  # as many as the loop asked for
                asks = s.execute(select(DecisionRow).where(DecisionRow.goal_id == goal_id, DecisionRow.kind == "ask")
                                 .order_by(DecisionRow.id.desc())).scalars()
                ask = next((a.data for a in asks if (a.data or {}).get("kind") == "budget_extension"), None) or {}
                experiments = int(ask.get("experiments") or 0)
            _check_amounts(card_hours, experiments)
            return self._extension(s, goal_id, "grant", float(card_hours), experiments, who, reason)

    def _extension(self, s: Session, goal_id: str, decision: str, card_hours: float, experiments: int, who: str,
                   reason: str | None) -> Extension:
        reason = check_reason(reason, required=False)  # given, it must say something (state/reasons.py)
        get_row(s, GoalRow, goal_id, "goal")
        row = ExtensionRow(goal_id=goal_id, decision=decision, card_hours=card_hours, experiments=experiments,
                           who=who, reason=reason, created_at=utcnow())
        s.add(row)
        s.flush()
        return snap(Extension, row)

    def extensions(self, goal_id: str) -> list[Extension]:
        with self._db.read() as s:
            rows = s.execute(select(ExtensionRow).where(ExtensionRow.goal_id == goal_id).order_by(ExtensionRow.id))
            return [snap(Extension, r) for r in rows.scalars()]


def _check_amounts(card_hours: float, experiments: int) -> None:
    """Both >= 0 and bounded, at least one > 0; FieldError naming the field otherwise."""
    if isinstance(card_hours, bool) or not isinstance(card_hours, (int, float)) \
            or not 0 <= card_hours <= MAX_EXTENSION_CARD_HOURS or card_hours != card_hours:
        raise FieldError("card_hours", f"must be a number from 0 to {MAX_EXTENSION_CARD_HOURS:g}, got {card_hours!r}")
    if isinstance(experiments, bool) or not isinstance(experiments, int) \
            or not 0 <= experiments <= MAX_EXTENSION_EXPERIMENTS:
        raise FieldError("experiments", f"must be an integer from 0 to {MAX_EXTENSION_EXPERIMENTS}, got {experiments!r}")
    if card_hours == 0 and experiments == 0:
        raise FieldError("card_hours", "an extension must add card-hours or experiments (both are 0)")


def _veto(row: VetoRow) -> Veto:
    return Veto(id=row.id, goal_id=row.goal_id, candidate_id=row.candidate_id, scenario=row.scenario, knob=row.knob,
                value=json.loads(row.value_key) if row.value_key is not None else None, parent_hash=row.parent_hash,
                data_version=row.data_version, source_identity=row.source_identity, source=row.source,  # type: ignore[arg-type]
                who=row.who, reason=row.reason, created_at=row.created_at)

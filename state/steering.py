"""What people steer a goal with besides approvals and instructions: vetoes and budget extensions.

A veto is a decision, not a measurement: a rejected change (or one the authorisation table denies) from
one parent station is never proposed again under the same conditions (scenario, parent station, data
version, source identity). A budget extension adds card-hours and experiments to one goal's budget; a
refusal is recorded too, so the loop that asked stops with its reason.
"""
from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from state.db import Database, get_row, snap, utcnow
from state.memory import value_key
from state.reasons import check_reason
from state.snapshots import Conditions, Extension, Veto
from state.tables import ExtensionRow, GoalRow, VetoRow
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
        """Grant more card-hours and/or experiments to a goal's budget (both >= 0, at least one > 0)."""
        if isinstance(card_hours, bool) or not isinstance(card_hours, (int, float)) \
                or not 0 <= card_hours <= MAX_EXTENSION_CARD_HOURS or card_hours != card_hours:
            raise FieldError("card_hours", f"must be a number from 0 to {MAX_EXTENSION_CARD_HOURS:g}, got {card_hours!r}")
        if isinstance(experiments, bool) or not isinstance(experiments, int) \
                or not 0 <= experiments <= MAX_EXTENSION_EXPERIMENTS:
            raise FieldError("experiments", f"must be an integer from 0 to {MAX_EXTENSION_EXPERIMENTS}, got {experiments!r}")
        if card_hours == 0 and experiments == 0:
            raise FieldError("card_hours", "an extension must add card-hours or experiments (both are 0)")
        return self._extension(goal_id, "grant", float(card_hours), experiments, who, reason)

    def refuse_extension(self, goal_id: str, who: str, reason: str | None = None) -> Extension:
        """Refuse the extension the loop asked for: the goal stops with this reason."""
        return self._extension(goal_id, "refuse", 0.0, 0, who, reason)

    def _extension(self, goal_id: str, decision: str, card_hours: float, experiments: int, who: str,
                   reason: str | None) -> Extension:
        reason = check_reason(reason, required=False)  # given, it must say something (state/reasons.py)
        with self._db.write() as s:
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


def _veto(row: VetoRow) -> Veto:
    return Veto(id=row.id, goal_id=row.goal_id, candidate_id=row.candidate_id, scenario=row.scenario, knob=row.knob,
                value=json.loads(row.value_key) if row.value_key is not None else None, parent_hash=row.parent_hash,
                data_version=row.data_version, source_identity=row.source_identity, source=row.source,  # type: ignore[arg-type]
                who=row.who, reason=row.reason, created_at=row.created_at)

"""Instructions from people (pause, resume, stop, one more round with a count, restore).

The newest instruction replaces the one in force; a round count is consumed one round at a time
under a row lock, so "one more round" runs exactly that many rounds even with several workers.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import select, update

from state.authorisation import validate_instruction
from state.db import Database, canon, get_row, snap, utcnow
from state.snapshots import Instruction
from state.tables import GoalRow, InstructionRow


class Instructions:
    """Mixin for Store (needs `self._db`)."""

    _db: Database

    def add_instruction(self, goal_id: str, kind: str, who: str, *, count: int | None = None,
                        knobs: dict[str, Any] | None = None, restore: str | None = None,
                        text: str | None = None) -> Instruction:
        """A person's instruction; it replaces the instruction in force (pause, resume, stop, rounds)."""

        count = validate_instruction(kind, count, knobs)
        with self._db.write() as s:
            get_row(s, GoalRow, goal_id, "goal")
            s.execute(update(InstructionRow).where(InstructionRow.goal_id == goal_id, InstructionRow.active)
                      .values(active=False))
            row = InstructionRow(goal_id=goal_id, kind=kind, count=count, remaining=count, knobs=canon(knobs or {}),
                                 restore=restore, who=who, text=text, active=True, created_at=utcnow())
            s.add(row)
            s.flush()
            return snap(Instruction, row)

    def current_instruction(self, goal_id: str) -> Instruction | None:
        with self._db.read() as s:
            row = s.execute(select(InstructionRow).where(InstructionRow.goal_id == goal_id, InstructionRow.active)
                            .order_by(InstructionRow.id.desc()).limit(1)).scalar_one_or_none()
            return snap(Instruction, row) if row else None

    def instructions(self, goal_id: str) -> list[Instruction]:
        with self._db.read() as s:
            rows = s.execute(select(InstructionRow).where(InstructionRow.goal_id == goal_id).order_by(InstructionRow.id))
            return [snap(Instruction, r) for r in rows.scalars()]

    def close_instruction(self, instruction_id: int) -> None:
        """An instruction carried out once (e.g. "go back to the best") stops being in force."""
        with self._db.write() as s:
            s.execute(update(InstructionRow).where(InstructionRow.id == instruction_id).values(active=False))

    def consume_round(self, goal_id: str) -> Instruction | None:
        """Count one finished round against the instruction in force; returns it (remaining 0 = stop)."""
        with self._db.write() as s:
            row = s.execute(select(InstructionRow).where(InstructionRow.goal_id == goal_id, InstructionRow.active)
                            .order_by(InstructionRow.id.desc()).limit(1).with_for_update()).scalar_one_or_none()
            if row is None or row.remaining is None:
                return snap(Instruction, row) if row else None
            row.remaining = max(0, row.remaining - 1)
            return snap(Instruction, row)


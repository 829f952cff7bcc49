"""Instructions from people (pause, resume, stop, one more round with a count, restore).

Two kinds. A mode (pause, resume, stop, one more round) is in force until the next mode replaces it; "go back to
the best" (restore) is carried out once, in the order given: a pause sent after it does not cancel it (the
restore runs, then the pause holds), and a restore replaces a resume or rounds given before it (going back to
the best ends the tuning they asked for). A second instruction of the same kind while the first is still to be
carried out (rounds left, a restore waiting, the same mode in force) is refused, recorded with why: it never
replaces a person's earlier word. Nothing a person said is dropped silently: every instruction ends with an
outcome, set once: "done: …" when the loop carried it out, "superseded by N (…) before it took effect" when a
later one of another kind replaced it first (the reply to the later one says so), "refused: …" when it could
not be carried out. A round count is consumed one round at a time under a row lock, so "one more round" runs
exactly that many rounds even with several workers.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import select, update

from state.authorisation import validate_instruction
from state.db import Database, canon, get_row, snap, utcnow
from state.lifecycle import OutcomeKind
from state.snapshots import Instruction
from state.tables import GoalRow, InstructionRow


class Instructions:
    """Mixin for Store (needs `self._db`)."""

    _db: Database

    def add_instruction(self, goal_id: str, kind: str, who: str, *, count: int | None = None,
                        knobs: dict[str, Any] | None = None, restore: str | None = None,
                        text: str | None = None) -> Instruction:
        """A person's instruction: a mode replaces a mode of another kind in force; what it replaces before that
        took effect records "superseded by" this one. The same kind as one still to be carried out is recorded
        refused (not in force, its outcome says which one goes first)."""

        count, knobs = validate_instruction(kind, count, knobs)
        now = utcnow()
        with self._db.write() as s:
            get_row(s, GoalRow, goal_id, "goal", lock=True)  # one writer per goal: the order is the ids' order
            older = list(s.execute(select(InstructionRow).where(InstructionRow.goal_id == goal_id,
                                                                InstructionRow.active)).scalars())
            first = next((o for o in older if o.kind == kind and _unfinished(o)), None)
            row = InstructionRow(goal_id=goal_id, kind=kind, count=count, remaining=count, knobs=canon(knobs or {}),
                                 restore=restore, who=who, text=text, active=first is None, created_at=now)
            if first is not None:
                row.outcome, row.outcome_kind, row.outcome_at = f"refused: {_pending(first)}", OutcomeKind.REFUSED, now
            s.add(row)
            s.flush()
            for old in older if first is None else ():
                if (old.kind == "restore") != (kind == "restore") and not (
                        kind == "restore" and old.kind in ("resume", "one_more_round")):
                    # a restore waits its turn whatever mode follows; a pause or a stop holds past a restore;
                    # what asked for more tuning (resume, rounds) is replaced by going back to the best
                    continue
                old.active = False
                if old.outcome is None:
                    ran = (f" after {old.count - old.remaining} of {old.count} round(s)"
                           if old.count and old.remaining is not None and old.remaining < old.count else "")
                    old.outcome = f"superseded by {row.id} ({kind.replace('_', ' ')} by {who}){ran or ' before it took effect'}"
                    old.outcome_kind, old.superseded_by, old.outcome_at = OutcomeKind.SUPERSEDED, row.id, now
            return snap(Instruction, row)

    def current_instruction(self, goal_id: str) -> Instruction | None:
        """The instruction the loop acts on next: the oldest restore still waiting, else the mode in force."""
        with self._db.read() as s:
            active = select(InstructionRow).where(InstructionRow.goal_id == goal_id, InstructionRow.active)
            row = s.execute(active.where(InstructionRow.kind == "restore").order_by(InstructionRow.id).limit(1)
                            ).scalar_one_or_none()
            row = row or s.execute(active.order_by(InstructionRow.id.desc()).limit(1)).scalar_one_or_none()
            return snap(Instruction, row) if row else None

    def instructions(self, goal_id: str) -> list[Instruction]:
        with self._db.read() as s:
            rows = s.execute(select(InstructionRow).where(InstructionRow.goal_id == goal_id).order_by(InstructionRow.id))
            return [snap(Instruction, r) for r in rows.scalars()]

    def close_instruction(self, instruction_id: int, kind: OutcomeKind | None = None, words: str = "") -> None:
        """An instruction carried out once (e.g. "go back to the best") or refused stops being in force, with its
        outcome (kept if one was recorded before)."""
        with self._db.write() as s:
            s.execute(update(InstructionRow).where(InstructionRow.id == instruction_id).values(active=False))
        if kind is not None:
            self.settle_instruction(instruction_id, kind, words)

    def settle_instruction(self, instruction_id: int, kind: OutcomeKind, words: str) -> None:
        """Record what became of an instruction, its kind and its words (recorded as "<kind>: <words>"; once: the
        first outcome stands); it may stay in force (a pause that paused the goal holds until the next mode)."""
        outcome = f"{kind.value}: {words}"
        with self._db.write() as s:
            s.execute(update(InstructionRow).where(InstructionRow.id == instruction_id, InstructionRow.outcome.is_(None))
                      .values(outcome=outcome[:2000], outcome_kind=kind.value, outcome_at=utcnow()))

    def consume_round(self, goal_id: str) -> Instruction | None:
        """Count one finished round against the instruction in force; returns it (remaining 0 = stop)."""
        with self._db.write() as s:
            row = s.execute(select(InstructionRow).where(InstructionRow.goal_id == goal_id, InstructionRow.active)
                            .order_by(InstructionRow.id.desc()).limit(1).with_for_update()).scalar_one_or_none()
            if row is None or row.remaining is None:
                return snap(Instruction, row) if row else None
            row.remaining = max(0, row.remaining - 1)
            return snap(Instruction, row)


def _unfinished(row: InstructionRow) -> bool:
    """Still to be carried out or in force: rounds left, a restore waiting, a mode (pause, resume, stop) in force."""
    return row.kind != "one_more_round" or row.remaining is None or row.remaining > 0


def _pending(row: InstructionRow) -> str:
    """Why a second instruction of this one's kind changes nothing, naming this one."""
    if row.kind == "one_more_round":
        at = f" at {', '.join(f'{k}={v}' for k, v in sorted(row.knobs.items()))}" if row.knobs else ""
        what = f"{row.count} more round(s){at}, {row.remaining} left"
    elif row.kind == "restore":
        what = f"go back to {f'station {row.restore}' if row.restore else 'the best station'}, still waiting"
    else:
        return f"instruction {row.id} by {row.who} ({row.kind}) is already in force; this one changes nothing"
    return f"instruction {row.id} by {row.who} ({what}) is not finished; it goes first and this one changes nothing"

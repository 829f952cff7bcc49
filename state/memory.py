"""Negatives memory: a negative applies only under the conditions it was observed in.

The same scenario, parent station, source identity and data version means "do not repeat"; any
difference means "may retry, and say which condition changed". Only a valid result may become a
negative: a fault says nothing about the configuration.
"""
from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from core.knobs import KnobError, catalog
from state.db import Database, dumps, utcnow
from state.errors import NotValid
from state.snapshots import Conditions, Negative, NegativeMatch
from state.tables import NegativeRow, ResultRow

CONDITION_FIELDS = ("scenario", "parent_hash", "source_identity", "data_version")


def value_key(knob: str, value: Any) -> str:
    """Canonical form of a knob value (so 6 and 6.0 of a float knob are the same negative)."""

    try:
        value = catalog().get(knob).coerce(value)
    except KnobError:
        pass  # not a catalog knob or not a valid value: compare as given
    return dumps(value)


def differences(a: Conditions, b: Conditions) -> tuple[str, ...]:
    """Names of the conditions that differ, in a fixed order."""
    return tuple(f for f in CONDITION_FIELDS if getattr(a, f) != getattr(b, f))


def match_negative(found: list[Negative], conditions: Conditions) -> NegativeMatch:
    """`same` if any stored negative has exactly these conditions; else `changed` naming what differs
    from the closest one; `none` if the knob/value was never negative."""
    if not found:
        return NegativeMatch(status="none")
    ranked = sorted(found, key=lambda n: (len(differences(n.conditions, conditions)), -n.id))
    best = ranked[0]
    diff = differences(best.conditions, conditions)
    return NegativeMatch(status="changed" if diff else "same", negative=best, changed=diff)


class Negatives:
    """Mixin for Store (needs `self._db`)."""

    _db: Database

    def add_negative(self, knob: str, value: Any, conditions: Conditions, *, goal_id: str | None = None,
                     run_id: str | None = None, candidate_id: int | None = None, reason: str = "") -> Negative:
        """Remember a negative; only a run with a `valid` result may become one (faults never do)."""
        with self._db.write() as s:
            if run_id is not None:
                res = s.get(ResultRow, run_id)
                if res is None or res.verdict != "valid":
                    raise NotValid(f"run {run_id}: verdict {res.verdict if res else 'missing'}; only a valid "
                                   "result may become a negative")
            row = NegativeRow(goal_id=goal_id, scenario=conditions.scenario, knob=knob, value_key=value_key(knob, value),
                              parent_hash=conditions.parent_hash, source_identity=conditions.source_identity,
                              data_version=conditions.data_version, run_id=run_id, candidate_id=candidate_id,
                              reason=reason, created_at=utcnow())
            s.add(row)
            s.flush()
            return _negative(row)

    def negatives(self, goal_id: str | None = None, scenario: str | None = None) -> list[Negative]:
        q = select(NegativeRow).order_by(NegativeRow.id)
        if goal_id is not None:
            q = q.where(NegativeRow.goal_id == goal_id)
        if scenario is not None:
            q = q.where(NegativeRow.scenario == scenario)
        with self._db.read() as s:
            return [_negative(r) for r in s.execute(q).scalars()]

    def find_negative(self, knob: str, value: Any, conditions: Conditions, *, goal_id: str | None = None) -> NegativeMatch:
        """Was knob=value negative before? `same` conditions (do not repeat) or `changed` (which ones)."""
        q = select(NegativeRow).where(NegativeRow.scenario == conditions.scenario, NegativeRow.knob == knob,
                                      NegativeRow.value_key == value_key(knob, value)).order_by(NegativeRow.id)
        if goal_id is not None:
            q = q.where(NegativeRow.goal_id == goal_id)
        with self._db.read() as s:
            found = [_negative(r) for r in s.execute(q).scalars()]
        return match_negative(found, conditions)


def _negative(row: NegativeRow) -> Negative:
    return Negative(id=row.id, goal_id=row.goal_id, knob=row.knob, value=json.loads(row.value_key),
                    conditions=Conditions(scenario=row.scenario, parent_hash=row.parent_hash,
                                          source_identity=row.source_identity, data_version=row.data_version),
                    run_id=row.run_id, candidate_id=row.candidate_id, reason=row.reason, created_at=row.created_at)

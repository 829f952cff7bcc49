"""`POST /goals` under an `Idempotency-Key` header: the same key (from the same principal) gives the same goal.

The goal's id is derived from the principal and the key alone (never the spec's name: a repeat with another name
must find the first goal and be refused, not create a second), so parallel requests with one key race for one
primary key: one inserts, the others find it; one whose spec differs gets 422. No key, or a new one, for a spec identical to a goal that is
still running, waiting or paused (so on the same target) gets 409 (state/store.py `unique_active`).
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Annotated

from fastapi import Header, HTTPException
from sqlalchemy.exc import IntegrityError

from state.errors import Conflict, NotFound

if TYPE_CHECKING:  # annotations only
    from state.goal import GoalSpec
    from state.snapshots import Goal
    from state.store import Store

KeyHeader = Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=128,
                                         pattern=r"^[\x21-\x7e]+$",
                                         description="any printable ASCII string (e.g. a UUID): a repeated "
                                                     "POST with the same key returns the goal the first created")]


def goal_id_for(who: str, key: str) -> str:
    return "key-" + hashlib.sha256("\0".join((who, key)).encode()).hexdigest()[:15]


def create_goal(store: Store, spec: GoalSpec, who: str, key: str | None) -> Goal:
    if key is None:
        return store.create_goal(spec, unique_active=True)
    gid = goal_id_for(who, key)
    try:
        return _same(store.get_goal(gid), spec)
    except NotFound:
        pass
    try:
        return store.create_goal(spec, gid, unique_active=True)
    except (Conflict, IntegrityError) as refused:
        try:
            won = store.get_goal(gid)  # a parallel request with this key won the insert
        except NotFound:
            raise refused from None  # an identical goal runs on the target: 409 naming it
        return _same(won, spec)


def _same(goal: Goal, spec: GoalSpec) -> Goal:
    if goal.spec_hash != spec.spec_hash():
        raise HTTPException(422, [{"loc": ["header", "Idempotency-Key"], "type": "value_error",
                                   "msg": "already used for a different goal spec; send a new key"}])
    return goal

"""The work queue of the service: which goal needs a worker, and which worker has it.

One row per goal. A person's action (post, approve, resume, an instruction) *wakes* the goal:
its generation grows and it becomes `ready`. A worker claims a ready goal (or one whose claim
expired: its worker died) with a lease of its own, runs the loop until it stops or waits for a
person, and finishes the claim: back to `idle`, or `ready` again if it was woken meanwhile. A loop that
failed for good is left `failed` (never claimed by itself) until a person's action wakes it again.
A goal is never claimed while another live claim holds a goal on the same target, so a worker
pointed at a busy target waits; the executor's per-target lease still guards every experiment.
"""
from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Float, ForeignKey, Integer, String, or_, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Mapped, mapped_column

from state.db import Database, utcnow
from state.store import Store
from state.tables import Base



class WorkState(StrEnum):
    """A work item's state; the column keeps the value (a StrEnum compares equal to its string)."""

    READY = "ready"
    CLAIMED = "claimed"
    IDLE = "idle"
    FAILED = "failed"


READY, CLAIMED, IDLE, FAILED = WorkState.READY, WorkState.CLAIMED, WorkState.IDLE, WorkState.FAILED
_PG_CLAIM_KEY = 0x776F_726B  # "work"


class WorkRow(Base):
    __tablename__ = "work_items"
    goal_id: Mapped[str] = mapped_column(String(64), ForeignKey("goals.id", ondelete="CASCADE"), primary_key=True)
    target: Mapped[str] = mapped_column(String(120), index=True)
    state: Mapped[str] = mapped_column(String(16), default=READY)
    gen: Mapped[int] = mapped_column(Integer, default=1)  # grows on every wake
    epoch: Mapped[int] = mapped_column(Integer, default=0)  # grows on every claim (fences a late finisher)
    worker: Mapped[str | None] = mapped_column(String(200))
    expires_at: Mapped[float] = mapped_column(Float, default=0.0)
    woken_by: Mapped[str | None] = mapped_column(String(200))
    updated_at: Mapped[datetime]


class WorkerRow(Base):
    """A worker thread's presence: written when it starts and at most every few seconds while it polls or runs
    a loop, so any process on the store (the API's /health) counts the workers that are alive, wherever they
    run."""
    __tablename__ = "workers"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    pid: Mapped[int] = mapped_column(Integer)
    seen_at: Mapped[float] = mapped_column(Float)  # the database clock (seconds), as claims' expiry


class WorkItem(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True)
    goal_id: str
    target: str
    state: str
    gen: int
    epoch: int
    worker: str | None = None
    expires_at: float = 0.0
    woken_by: str | None = None


class Claim(BaseModel):
    """What a worker holds: finish it with the same (gen, epoch) it got."""

    model_config = ConfigDict(frozen=True)
    goal_id: str
    target: str
    gen: int
    epoch: int
    worker: str


class WorkQueue:
    """Mixin for Store (needs `self._db` and `self._now(session)` from Fencing)."""

    _db: Database

    def wake(self, goal_id: str, who: str, target: str | None = None) -> WorkItem:
        """Ask for a worker for this goal (idempotent: a running claim picks the wake up when it finishes)."""
        if target is None:
            target = self.get_goal(goal_id).spec.target  # type: ignore[attr-defined]
        with self._db.write() as s:
            row = s.get(WorkRow, goal_id, with_for_update=True)
            if row is None:
                ins = (postgresql.insert if self._db.dialect == "postgresql" else sqlite.insert)(WorkRow)
                s.execute(ins.values(goal_id=goal_id, target=target, state=READY, gen=0, epoch=0,
                                     expires_at=0.0, updated_at=utcnow()).on_conflict_do_nothing())
                row = s.execute(select(WorkRow).where(WorkRow.goal_id == goal_id).with_for_update()).scalar_one()
            row.gen += 1
            if row.state != CLAIMED:
                row.state = READY
            row.woken_by, row.updated_at = who, utcnow()
            return WorkItem.model_validate(row)

    def claim(self, worker: str, ttl_s: float, targets: list[str] | None = None) -> Claim | None:
        """The oldest ready goal on a free target (or one whose worker's claim expired), else None."""
        with self._db.write() as s:
            if self._db.dialect == "postgresql":  # one claimer at a time (SQLite: BEGIN IMMEDIATE already is)
                s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_CLAIM_KEY})
            now = self._now(s)  # type: ignore[attr-defined]
            live = (WorkRow.state == CLAIMED) & (WorkRow.expires_at > now)
            busy = {t for (t,) in s.execute(select(WorkRow.target).where(live)).all()}
            q = select(WorkRow).where(or_(WorkRow.state == READY,
                                          (WorkRow.state == CLAIMED) & (WorkRow.expires_at <= now)))
            if targets:
                q = q.where(WorkRow.target.in_(targets))
            if busy:
                q = q.where(WorkRow.target.not_in(busy))
            row = s.execute(q.order_by(WorkRow.updated_at).limit(1).with_for_update()).scalar_one_or_none()
            if row is None:
                return None
            row.state, row.worker, row.expires_at = CLAIMED, worker, now + ttl_s
            row.epoch += 1
            row.updated_at = utcnow()
            return Claim(goal_id=row.goal_id, target=row.target, gen=row.gen, epoch=row.epoch, worker=worker)

    def heartbeat(self, claim: Claim, ttl_s: float) -> bool:
        """Extend a live claim; False once it expired and someone else claimed the goal."""
        with self._db.write() as s:
            row = s.execute(select(WorkRow).where(WorkRow.goal_id == claim.goal_id).with_for_update()).scalar_one()
            if row.state != CLAIMED or row.epoch != claim.epoch or row.worker != claim.worker:
                return False
            row.expires_at = self._now(s) + ttl_s  # type: ignore[attr-defined]
            return True

    def finish(self, claim: Claim) -> WorkItem:
        """Give the goal back: idle, or ready again when a wake arrived while the loop ran."""
        return self._give_back(claim, IDLE)

    def fail(self, claim: Claim) -> WorkItem:
        """Give the goal back as `failed` (the why is the goal's status reason): no worker retries it until a
        person wakes it (resume, approve, …). A wake that arrived while the loop ran counts as that retry."""
        return self._give_back(claim, FAILED)

    def _give_back(self, claim: Claim, state: str) -> WorkItem:
        """Release a claim we still hold into `state`, or READY when a wake arrived while the loop ran."""
        with self._db.write() as s:
            row = s.execute(select(WorkRow).where(WorkRow.goal_id == claim.goal_id).with_for_update()).scalar_one()
            if row.state == CLAIMED and row.epoch == claim.epoch and row.worker == claim.worker:
                row.state = state if row.gen == claim.gen else READY
                row.worker, row.expires_at, row.updated_at = None, 0.0, utcnow()
            return WorkItem.model_validate(row)

    def present(self, worker: str, pid: int) -> None:
        """This worker is alive now (an upsert of its presence row)."""
        with self._db.write() as s:
            now = self._now(s)  # type: ignore[attr-defined]
            ins = (postgresql.insert if self._db.dialect == "postgresql" else sqlite.insert)(WorkerRow)
            s.execute(ins.values(name=worker, pid=pid, seen_at=now)
                      .on_conflict_do_update(index_elements=["name"], set_={"pid": pid, "seen_at": now}))

    def absent(self, worker: str) -> None:
        """This worker stopped (a clean exit; a killed one ages out)."""
        with self._db.write() as s:
            s.execute(WorkerRow.__table__.delete().where(WorkerRow.name == worker))

    def workers_alive(self, within_s: float) -> list[str]:
        """Names of the workers seen within the last `within_s` seconds, by the database clock."""
        with self._db.read() as s:
            now = self._now(s)  # type: ignore[attr-defined]
            rows = s.execute(select(WorkerRow.name).where(WorkerRow.seen_at > now - within_s).order_by(WorkerRow.name))
            return [n for (n,) in rows.all()]

    def work_items(self) -> list[WorkItem]:
        with self._db.read() as s:
            return [WorkItem.model_validate(r) for r in s.execute(select(WorkRow).order_by(WorkRow.goal_id)).scalars()]

    def work_item(self, goal_id: str) -> WorkItem | None:
        with self._db.read() as s:
            row = s.get(WorkRow, goal_id)
            return WorkItem.model_validate(row) if row else None


class QueueStore(Store, WorkQueue):
    """The store plus the service's work queue (what `tuneloop serve` and `tuneloop worker` open)."""


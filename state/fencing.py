"""Leases with fencing epochs and the phase journal (core/journal.py's Journal and Leases).

A lease row per target holds (holder, epoch, expires_at in unix seconds, read from PostgreSQL's
clock when workers share one, so hosts with skewed clocks agree). The epoch only grows: every acquisition
takes the next number, release keeps it. A phase record is accepted only if it carries the target's
current epoch, checked against the lease row inside the same transaction, so a holder that was
paused past its lease and replaced can no longer write.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from sqlalchemy import select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core.errors import FieldError
from core.journal import PhaseRecord
from state.db import Database, canon, utcnow
from state.errors import StaleEpoch
from state.snapshots import Lease
from state.tables import LeaseRow, PhaseRow


class Fencing:
    """Mixin for Store: needs `self._db` and `self._clock` (unix seconds, shared by processes)."""

    _db: Database
    _clock: Callable[[], float] | None = None  # None: the database's clock (one clock for every host)

    def _now(self, s: Session) -> float:
        if self._clock is not None:
            return self._clock()
        if self._db.dialect == "postgresql":
            return float(s.execute(text("SELECT EXTRACT(EPOCH FROM clock_timestamp())")).scalar_one())
        return time.time()  # SQLite: every process is on this host

    def _lease_for_update(self, s: Session, target: str) -> LeaseRow:
        ins = (postgresql.insert if self._db.dialect == "postgresql" else sqlite.insert)(LeaseRow)
        s.execute(ins.values(target=target, holder=None, epoch=0, expires_at=0.0).on_conflict_do_nothing())
        return s.execute(select(LeaseRow).where(LeaseRow.target == target).with_for_update()).scalar_one()

    def acquire_lease(self, target: str, holder: str, ttl_s: float) -> int | None:
        """A new epoch (strictly larger than any before) or None while another live holder has it."""
        with self._db.write() as s:
            row = self._lease_for_update(s, target)
            now = self._now(s)
            if row.holder is not None and row.holder != holder and row.expires_at > now:
                return None
            row.epoch += 1
            row.holder, row.expires_at = holder, now + ttl_s
            return row.epoch

    def renew_lease(self, target: str, holder: str, epoch: int, ttl_s: float) -> bool:
        """Extend the lease if `holder` still holds it at `epoch`; False once anyone took a newer epoch."""
        with self._db.write() as s:
            row = self._lease_for_update(s, target)
            if row.holder != holder or row.epoch != epoch:
                return False
            row.expires_at = self._now(s) + ttl_s
            return True

    def release_lease(self, target: str, holder: str, epoch: int) -> None:
        """Give the target up; a stale holder's release changes nothing."""
        with self._db.write() as s:
            row = self._lease_for_update(s, target)
            if row.holder == holder and row.epoch == epoch:
                row.holder, row.expires_at = None, 0.0

    def current_epoch(self, target: str) -> int:
        with self._db.read() as s:
            row = s.get(LeaseRow, target)
            return row.epoch if row else 0

    def lease(self, target: str) -> Lease | None:
        with self._db.read() as s:
            row = s.get(LeaseRow, target)
            return Lease.model_validate(row, from_attributes=True) if row else None

    def record_phase(self, run_id: str, phase: str, event: str, status: str, *, epoch: int, target: str,
                     detail: dict[str, Any] | None = None, error_class: str | None = None) -> PhaseRecord:
        """Append one phase record; raises StaleEpoch unless `epoch` is the target's current epoch."""
        if event not in ("intent", "outcome"):
            raise FieldError("event", f"must be 'intent' or 'outcome', got {event!r}")
        with self._db.write() as s:
            lease = s.execute(select(LeaseRow).where(LeaseRow.target == target).with_for_update(read=True)).scalar_one_or_none()
            current = lease.epoch if lease else 0
            if epoch != current:
                raise StaleEpoch(target, epoch, current)
            row = PhaseRow(run_id=run_id, phase=phase, event=event, status=status, epoch=epoch, target=target,
                           detail=canon(detail) if detail is not None else None, error_class=error_class, at=utcnow())
            s.add(row)
            s.flush()
            return _phase(row)

    def phases(self, run_id: str) -> list[PhaseRecord]:
        """Every record of the run in the order written."""
        with self._db.read() as s:
            rows = s.execute(select(PhaseRow).where(PhaseRow.run_id == run_id).order_by(PhaseRow.seq)).scalars()
            return [_phase(r) for r in rows]


def _phase(row: PhaseRow) -> PhaseRecord:
    return PhaseRecord(run_id=row.run_id, phase=row.phase, event=row.event, status=row.status, epoch=row.epoch,
                       target=row.target, detail=row.detail, error_class=row.error_class, seq=row.seq, at=row.at)

"""The state store: the loop's record of truth (goals, stations, candidates, runs, phases, results,
decisions, approvals, instructions, negatives, budget ledger, leases).

`Store(url)` works on a SQLite file (`sqlite:///path`, the default) or PostgreSQL, is safe for
several processes, runs `alembic upgrade head` on open, and hands out frozen snapshots only.
"""
from __future__ import annotations

import os
import uuid
from typing import Any, Callable

from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.errors import FieldError
from core.trial import CostEntry, TrialResult, TrialSpec
from state import lifecycle
from state.approvals import Candidates, card_hash  # noqa: F401  (card_hash re-exported)
from state.db import Database, canon, get_row, snap, utcnow
from state.errors import Conflict
from state.fencing import Fencing
from state.goal import GoalSpec
from state.instructions import Instructions
from state.ledger import budget_state
from state.memory import Negatives
from state.migrate import upgrade
from state.snapshots import Decision, DecisionKind, Goal, LedgerEntry, Result, Run, Station
from state.steering import Steering
from state.tables import DecisionRow, GoalRow, LedgerRow, ResultRow, RunRow, StationRow

DECISION_KINDS: tuple[str, ...] = DecisionKind.__args__  # type: ignore[attr-defined]
BEST_KINDS = ("baseline", "new_best", "quality_passed")
FRONTIER_KINDS = BEST_KINDS + ("tradeoff",)
ACTIVE_GOAL = ("running", "waiting", "paused")


def best_of(decisions: list[Decision]) -> Decision | None:
    """The one rule for "the best" (the store, the planner's history, STATE.md and the report all use it): the
    latest new best or passed quality check; the start's reference only while nothing has beaten it."""
    found = [d for d in decisions if d.kind in BEST_KINDS]
    made = [d for d in found if d.kind != "baseline"]
    return (made or found)[-1] if found else None  # a goal whose loop still holds (or will take) its target


def default_url() -> str:
    """The store every CLI command opens unless told otherwise: $TUNELOOP_DB, else .tuneloop/tuneloop.db."""
    return os.environ.get("TUNELOOP_DB") or "sqlite:///.tuneloop/tuneloop.db"


class Store(Fencing, Candidates, Instructions, Negatives, Steering):
    def __init__(self, url: str = "sqlite:///tuneloop.db", *, clock: Callable[[], float] | None = None):
        if "://" not in url:  # a bare path means a SQLite file
            url = f"sqlite:///{url}"
        self._db = Database(url)
        self._specs: dict[str, GoalSpec] = {}
        self._clock = clock
        upgrade(self._db.engine)

    @property
    def url(self) -> str:
        return self._db.url

    @property
    def local_writes(self) -> int:
        """Write transactions committed through this store object (this process) so far."""
        return self._db.local_writes

    def change_stamp(self) -> Any:
        """Differs after any commit by anyone (state.db.Database.change_stamp); None: cannot tell."""
        return self._db.change_stamp()

    def close(self) -> None:
        self._db.dispose()

    # -- goals ---------------------------------------------------------------------------------------
    def create_goal(self, spec: GoalSpec, goal_id: str | None = None, *, unique_active: bool = False) -> Goal:
        """A new goal. With `unique_active` it is refused (Conflict) while a goal with the identical spec (so
        on the same target) is still running, waiting or paused; the check and the insert are one transaction
        (SQLite: BEGIN IMMEDIATE; PostgreSQL: an advisory lock on the spec hash)."""
        gid = goal_id or f"{spec.name[:40]}-{uuid.uuid4().hex[:8]}"
        now = utcnow()
        with self._db.write() as s:
            if s.get(GoalRow, gid) is not None:
                raise Conflict(f"goal {gid!r} exists")
            if unique_active:
                h = spec.spec_hash()
                if self._db.dialect == "postgresql":
                    s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": int(h[:15], 16)})
                dup = s.execute(select(GoalRow).where(GoalRow.spec_hash == h, GoalRow.status.in_(ACTIVE_GOAL))
                                .limit(1)).scalar_one_or_none()
                if dup is not None:
                    raise Conflict(f"an identical goal {dup.id} (spec hash {h}) is already {dup.status} on target "
                                   f"{spec.target!r}; stop it first, or change the spec")
            row = GoalRow(id=gid, name=spec.name, spec=canon(spec.model_dump()), spec_hash=spec.spec_hash(),
                          status="running", created_at=now, updated_at=now)
            s.add(row)
            s.flush()
            return self._goal(row)

    def open_goal(self, spec: GoalSpec) -> Goal:
        """The latest goal with exactly this spec (so a restarted `tuneloop run` continues it), else a new one."""
        with self._db.read() as s:
            row = s.execute(select(GoalRow).where(GoalRow.spec_hash == spec.spec_hash())
                            .order_by(GoalRow.created_at.desc()).limit(1)).scalar_one_or_none()
            if row is not None:
                return self._goal(row)
        return self.create_goal(spec)

    def get_goal(self, goal_id: str) -> Goal:
        with self._db.read() as s:
            return self._goal(get_row(s, GoalRow, goal_id, "goal"))

    def goals(self) -> list[Goal]:
        with self._db.read() as s:
            return [self._goal(r) for r in s.execute(select(GoalRow).order_by(GoalRow.created_at)).scalars()]

    def set_goal_status(self, goal_id: str, status: str, reason: str | None = None,
                        waiting_for: lifecycle.WaitingFor | None = None) -> Goal:
        """The goal's status and why; `waiting_for`: what a waiting goal waits for (kept only while it waits)."""
        with self._db.write() as s:
            row = get_row(s, GoalRow, goal_id, "goal", lock=True)
            lifecycle.check("goal", row.status, status)
            row.status, row.status_reason, row.updated_at = status, reason, utcnow()
            row.waiting_for = waiting_for.value if waiting_for is not None and status == "waiting" else None
            return self._goal(row)

    def _goal(self, row: GoalRow) -> Goal:
        spec = self._specs.get(row.spec_hash)  # a goal's spec never changes: validated (files looked up) once
        if spec is None:
            spec = GoalSpec.model_validate(row.spec)
            if len(self._specs) >= 1024:
                self._specs.clear()
            self._specs[row.spec_hash] = spec
        return Goal(id=row.id, name=row.name, spec=spec, spec_hash=row.spec_hash,
                    status=row.status, status_reason=row.status_reason, waiting_for=row.waiting_for,
                    created_at=row.created_at,
                    updated_at=row.updated_at)

    # -- stations ------------------------------------------------------------------------------------
    def put_station(self, station: Any) -> Station:
        """Store a station (core.station.Station or the same fields); idempotent by content hash."""
        fields = {f: getattr(station, f) for f in ("engine", "scenario", "target", "data_version", "source_identity")}
        h = station.hash
        with self._db.write() as s:
            row = s.get(StationRow, h)
            if row is None:
                row = StationRow(hash=h, knobs=canon(dict(station.knobs)), created_at=utcnow(), **fields)
                s.add(row)
                s.flush()
            return snap(Station, row)

    def get_station(self, station_hash: str) -> Station:
        with self._db.read() as s:
            return snap(Station, get_row(s, StationRow, station_hash, "station"))

    # -- runs and results ----------------------------------------------------------------------------
    def create_run(self, spec: TrialSpec, *, candidate_id: int | None = None, station_hash: str | None = None) -> Run:
        """Register a run before it launches; idempotent on spec.run_id."""
        now = utcnow()
        try:
            with self._db.write() as s:
                old = s.get(RunRow, spec.run_id)
                if old is not None:
                    return snap(Run, old)
                row = RunRow(id=spec.run_id, goal_id=spec.goal_id, candidate_id=candidate_id, stage=spec.stage, n=spec.n,
                             target=spec.target, spec=canon(spec.model_dump()), station_hash=station_hash,
                             status="pending", created_at=now, updated_at=now)
                s.add(row)
                s.flush()
                return snap(Run, row)
        except IntegrityError:
            return self.get_run(spec.run_id)

    def get_run(self, run_id: str) -> Run:
        with self._db.read() as s:
            return snap(Run, get_row(s, RunRow, run_id, "run"))

    def runs(self, goal_id: str | None = None, status: str | None = None) -> list[Run]:
        q = select(RunRow).order_by(RunRow.created_at, RunRow.id)
        if goal_id is not None:
            q = q.where(RunRow.goal_id == goal_id)
        if status is not None:
            q = q.where(RunRow.status == status)
        with self._db.read() as s:
            return [snap(Run, r) for r in s.execute(q).scalars()]

    def set_run_status(self, run_id: str, status: str, reason: str | None = None,
                       station_hash: str | None = None) -> Run:
        with self._db.write() as s:
            row = get_row(s, RunRow, run_id, "run", lock=True)
            lifecycle.check("run", row.status, status)
            row.status, row.status_reason, row.updated_at = status, reason, utcnow()
            if station_hash is not None:
                row.station_hash = station_hash
            return snap(Run, row)

    # -- UNKNOWN targets: the store's run status is the one record of them --------------------------------
    def unknown_targets(self) -> dict[str, str]:
        """Targets with a run in the UNKNOWN state, each with its latest such run and why: no work is issued to
        them until a person re-verifies the target (clear_unknown)."""
        q = select(RunRow).where(RunRow.status == "unknown").order_by(RunRow.updated_at, RunRow.id)
        with self._db.read() as s:
            return {r.target: f"run {r.id}: {r.status_reason or 'state unknown'}" for r in s.execute(q).scalars()}

    def mark_unknown(self, spec: TrialSpec, why: str) -> Run:
        """After an unclear fault: the run (registered here if nobody did) is UNKNOWN, and so is its target."""
        self.create_run(spec)
        return self.set_run_status(spec.run_id, "unknown", why)

    def clear_unknown(self, target: str, who: str, why: str = "") -> list[str]:
        """A person re-verified the target: its UNKNOWN runs become failed (a fault, never a result); their ids."""
        with self._db.write() as s:
            rows = s.execute(select(RunRow).where(RunRow.target == target, RunRow.status == "unknown")
                             .with_for_update()).scalars().all()
            for row in rows:
                lifecycle.check("run", row.status, "failed")
                row.status, row.updated_at = "failed", utcnow()
                row.status_reason = f"UNKNOWN cleared: target {target} re-verified by {who}" + (f" ({why})" if why else "")
            return [r.id for r in rows]

    def record_result(self, result: TrialResult, goal_id: str | None = None) -> Result:
        """Store (or replace, after a re-collection) a run's result and charge its costs to the ledger."""
        with self._db.write() as s:
            run = s.get(RunRow, result.run_id)
            gid = goal_id or (run.goal_id if run else None)
            row = s.get(ResultRow, result.run_id)
            data = canon(result.model_dump(mode="json"))
            if run is not None and result.station_hash:  # one transaction: a verdict is never shown without its station
                run.station_hash = result.station_hash
            if row is None:
                row = ResultRow(run_id=result.run_id, goal_id=gid, verdict=result.verdict.kind, result=data,
                                station_hash=result.station_hash, created_at=utcnow())
                s.add(row)
            else:
                row.verdict, row.result, row.station_hash, row.goal_id = result.verdict.kind, data, result.station_hash, gid
            self._charge(s, gid, result.run_id, result.costs)
            s.flush()
            return self._result(row)

    def get_result(self, run_id: str) -> Result | None:
        with self._db.read() as s:
            row = s.get(ResultRow, run_id)
            return self._result(row) if row else None

    def results(self, goal_id: str) -> list[Result]:
        with self._db.read() as s:
            rows = s.execute(select(ResultRow).where(ResultRow.goal_id == goal_id).order_by(ResultRow.created_at))
            return [self._result(r) for r in rows.scalars()]

    @staticmethod
    def _result(row: ResultRow) -> Result:
        return Result(run_id=row.run_id, goal_id=row.goal_id, verdict=row.verdict,
                      result=TrialResult.model_validate(row.result), station_hash=row.station_hash,
                      created_at=row.created_at)

    # -- budget ledger -------------------------------------------------------------------------------
    def charge(self, run_id: str, costs: list[CostEntry], goal_id: str | None = None) -> None:
        """Record a run's costs; charging the same run again replaces its entries (never double-counts)."""
        with self._db.write() as s:
            run = s.get(RunRow, run_id)
            self._charge(s, goal_id or (run.goal_id if run else None), run_id, costs)

    @staticmethod
    def _charge(s: Session, goal_id: str | None, run_id: str, costs: list[CostEntry]) -> None:
        for old in s.execute(select(LedgerRow).where(LedgerRow.run_id == run_id)).scalars():
            s.delete(old)
        s.flush()
        now = utcnow()
        for i, c in enumerate(costs):
            s.add(LedgerRow(goal_id=goal_id, run_id=run_id, idx=i, what=c.what, seconds=c.seconds, cards=c.cards,
                            card_hours=c.card_hours, created_at=now))

    def ledger(self, goal_id: str) -> list[LedgerEntry]:
        with self._db.read() as s:
            rows = s.execute(select(LedgerRow).where(LedgerRow.goal_id == goal_id).order_by(LedgerRow.id)).scalars()
            return [snap(LedgerEntry, r) for r in rows]

    def card_hours_used(self, goal_id: str) -> float:
        with self._db.read() as s:
            return float(s.execute(select(func.coalesce(func.sum(LedgerRow.card_hours), 0.0))
                                   .where(LedgerRow.goal_id == goal_id)).scalar_one())

    def budget(self, goal_id: str, now: Any = None) -> Any:
        """Budget used and left for a goal (state.ledger.BudgetState)."""

        return budget_state(self.get_goal(goal_id), self.ledger(goal_id), self.runs(goal_id), now=now,
                            extensions=self.extensions(goal_id))

    # -- decisions -----------------------------------------------------------------------------------
    def record_decision(self, goal_id: str, kind: str, *, candidate_id: int | None = None, run_id: str | None = None,
                        station_hash: str | None = None, changed: bool = False, text: str = "",
                        data: dict[str, Any] | None = None) -> Decision:
        if kind not in DECISION_KINDS:
            raise FieldError("kind", f"must be one of {list(DECISION_KINDS)}, got {kind!r}")
        with self._db.write() as s:
            get_row(s, GoalRow, goal_id, "goal")
            row = DecisionRow(goal_id=goal_id, kind=kind, candidate_id=candidate_id, run_id=run_id,
                              station_hash=station_hash, changed=changed, text=text, data=canon(data or {}),
                              created_at=utcnow())
            s.add(row)
            s.flush()
            return snap(Decision, row)

    def decisions(self, goal_id: str, kinds: tuple[str, ...] | None = None) -> list[Decision]:
        q = select(DecisionRow).where(DecisionRow.goal_id == goal_id).order_by(DecisionRow.id)
        if kinds:
            q = q.where(DecisionRow.kind.in_(kinds))
        with self._db.read() as s:
            return [snap(Decision, r) for r in s.execute(q).scalars()]

    def best(self, goal_id: str) -> Decision | None:
        """The decision that made the current deployable best (never a quality-pending one): the latest new
        best (or passed quality check); the start's reference only while nothing has beaten it. A later
        reference run of the best station (e.g. at the screen N, for the next screens) made nothing best."""
        return best_of(self.decisions(goal_id, BEST_KINDS))

    def best_station(self, goal_id: str) -> Station | None:
        d = self.best(goal_id)
        return self.get_station(d.station_hash) if d and d.station_hash else None

    def frontier(self, goal_id: str) -> list[Decision]:
        """Valid stations kept as trade-offs or bests: the latest decision per station and N
        (results of different N stay side by side)."""
        n_of = {r.id: r.n for r in self.runs(goal_id)}
        latest: dict[tuple[str, int | None], Decision] = {}
        for d in self.decisions(goal_id, FRONTIER_KINDS):
            latest[(d.station_hash or f"run:{d.run_id}", n_of.get(d.run_id or ""))] = d
        return list(latest.values())

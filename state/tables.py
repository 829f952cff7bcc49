"""Private ORM tables of the state layer. Nothing outside `state/` imports this module:
the store hands out frozen snapshots (state/snapshots.py), never these rows.

Schema changes go through an Alembic revision in state/migrations/versions/.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on both backends (SQLite hands back naive datetimes otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: datetime | None, dialect: object) -> datetime | None:
        return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, Any: JSON, datetime: UTCDateTime()}


class GoalRow(Base):
    __tablename__ = "goals"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(120))
    spec: Mapped[dict[str, Any]]
    spec_hash: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(24), default="running")
    status_reason: Mapped[str | None] = mapped_column(Text)
    waiting_for: Mapped[str | None] = mapped_column(String(24))  # lifecycle.WaitingFor while status is "waiting"
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class StationRow(Base):
    __tablename__ = "stations"
    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    engine: Mapped[str] = mapped_column(String(32))
    scenario: Mapped[str] = mapped_column(String(200))
    target: Mapped[str] = mapped_column(String(200))
    data_version: Mapped[str] = mapped_column(String(200))
    source_identity: Mapped[str] = mapped_column(String(200))
    knobs: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class CandidateRow(Base):
    __tablename__ = "candidates"
    __table_args__ = (UniqueConstraint("goal_id", "card_hash", name="uq_candidate_goal_card"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    goal_id: Mapped[str] = mapped_column(ForeignKey("goals.id"), index=True)
    card: Mapped[dict[str, Any]]
    card_hash: Mapped[str] = mapped_column(String(64))
    knob: Mapped[str | None] = mapped_column(String(80))
    value: Mapped[Any] = mapped_column(JSON, nullable=True)
    parent_hash: Mapped[str | None] = mapped_column(String(64))
    cost_class: Mapped[str | None] = mapped_column(String(24))
    stage: Mapped[str] = mapped_column(String(16), default="screen")
    status: Mapped[str] = mapped_column(String(24))
    status_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class RunRow(Base):
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(120), primary_key=True)
    goal_id: Mapped[str | None] = mapped_column(String(64), index=True)
    candidate_id: Mapped[int | None] = mapped_column(Integer)
    stage: Mapped[str] = mapped_column(String(16))
    n: Mapped[int] = mapped_column(Integer)
    target: Mapped[str] = mapped_column(String(200))
    spec: Mapped[dict[str, Any]]
    station_hash: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(24))
    status_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class PhaseRow(Base):
    """Append-only: the store has no method that updates or deletes one."""

    __tablename__ = "phase_records"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(120), index=True)
    phase: Mapped[str] = mapped_column(String(32))
    event: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(24))
    epoch: Mapped[int] = mapped_column(Integer)
    target: Mapped[str] = mapped_column(String(200))
    detail: Mapped[Any] = mapped_column(JSON, nullable=True)
    error_class: Mapped[str | None] = mapped_column(String(80))
    at: Mapped[datetime]


class ResultRow(Base):
    __tablename__ = "results"
    run_id: Mapped[str] = mapped_column(String(120), primary_key=True)
    goal_id: Mapped[str | None] = mapped_column(String(64), index=True)
    verdict: Mapped[str] = mapped_column(String(32))
    result: Mapped[dict[str, Any]]  # the whole TrialResult (verdict, summary, evidence, costs)
    station_hash: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime]


class DecisionRow(Base):
    __tablename__ = "decisions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    goal_id: Mapped[str] = mapped_column(ForeignKey("goals.id"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    candidate_id: Mapped[int | None] = mapped_column(Integer)
    run_id: Mapped[str | None] = mapped_column(String(120))
    station_hash: Mapped[str | None] = mapped_column(String(64))
    changed: Mapped[bool] = mapped_column(Boolean, default=False)
    text: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class ApprovalRow(Base):
    __tablename__ = "approvals"
    __table_args__ = (UniqueConstraint("candidate_id", name="uq_approval_candidate"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    candidate_id: Mapped[int] = mapped_column(ForeignKey("candidates.id"))
    card_hash: Mapped[str] = mapped_column(String(64))
    decision: Mapped[str] = mapped_column(String(16))
    who: Mapped[str] = mapped_column(String(120))
    reason: Mapped[str | None] = mapped_column(Text)
    context: Mapped[Any] = mapped_column(JSON, nullable=True)  # the budget and deadline it was given under
    # person | table (the authorisation table's `auto`) | flag (--auto-approve): the loop's own approvals, counted apart
    given_by: Mapped[str] = mapped_column(String(16), default="person", server_default="person")
    created_at: Mapped[datetime]


class InstructionRow(Base):
    __tablename__ = "instructions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    goal_id: Mapped[str] = mapped_column(ForeignKey("goals.id"), index=True)
    kind: Mapped[str] = mapped_column(String(24))
    count: Mapped[int | None] = mapped_column(Integer)
    remaining: Mapped[int | None] = mapped_column(Integer)
    knobs: Mapped[dict[str, Any]]
    restore: Mapped[str | None] = mapped_column(String(64))
    who: Mapped[str] = mapped_column(String(120))
    text: Mapped[str | None] = mapped_column(Text)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime]
    outcome: Mapped[str | None] = mapped_column(Text)  # done: … / superseded by N … / refused: …
    outcome_at: Mapped[datetime | None]
    outcome_kind: Mapped[str | None] = mapped_column(String(24))  # lifecycle.OutcomeKind of `outcome`
    superseded_by: Mapped[int | None] = mapped_column(Integer)  # the instruction that replaced it


class NegativeRow(Base):
    __tablename__ = "negatives"
    __table_args__ = (Index("ix_negative_lookup", "scenario", "knob", "value_key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    goal_id: Mapped[str | None] = mapped_column(String(64), index=True)
    scenario: Mapped[str] = mapped_column(String(200))
    knob: Mapped[str] = mapped_column(String(80))
    value_key: Mapped[str] = mapped_column(String(200))  # canonical JSON of the value
    parent_hash: Mapped[str | None] = mapped_column(String(64))
    source_identity: Mapped[str | None] = mapped_column(String(200))
    data_version: Mapped[str | None] = mapped_column(String(200))
    run_id: Mapped[str | None] = mapped_column(String(120))
    candidate_id: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime]


class LedgerRow(Base):
    __tablename__ = "ledger"
    __table_args__ = (UniqueConstraint("run_id", "idx", name="uq_ledger_run_idx"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    goal_id: Mapped[str | None] = mapped_column(String(64), index=True)
    run_id: Mapped[str] = mapped_column(String(120))
    idx: Mapped[int] = mapped_column(Integer)
    what: Mapped[str] = mapped_column(String(24))
    seconds: Mapped[float] = mapped_column(Float)
    cards: Mapped[int] = mapped_column(Integer)
    card_hours: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime]


class LeaseRow(Base):
    __tablename__ = "leases"
    target: Mapped[str] = mapped_column(String(200), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(200))
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    expires_at: Mapped[float] = mapped_column(Float, default=0.0)  # unix seconds: shared by processes


class VetoRow(Base):
    """A person's rejection (or the authorisation table's deny) of one change from one parent station, under
    the conditions it was made in: never proposed again under the same ones. Not a measurement."""

    __tablename__ = "vetoes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    goal_id: Mapped[str] = mapped_column(ForeignKey("goals.id"), index=True)
    candidate_id: Mapped[int | None] = mapped_column(Integer)
    scenario: Mapped[str] = mapped_column(String(200))
    knob: Mapped[str | None] = mapped_column(String(80))  # None: the reference of the parent station itself
    value_key: Mapped[str | None] = mapped_column(String(200))
    parent_hash: Mapped[str] = mapped_column(String(64))
    data_version: Mapped[str | None] = mapped_column(String(200))
    source_identity: Mapped[str | None] = mapped_column(String(200))
    source: Mapped[str] = mapped_column(String(24))  # person | authorisation
    who: Mapped[str] = mapped_column(String(120))
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime]


class ExtensionRow(Base):
    """A budget extension a person granted (card-hours and experiments added to the goal's budget) or refused."""

    __tablename__ = "budget_extensions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    goal_id: Mapped[str] = mapped_column(ForeignKey("goals.id"), index=True)
    decision: Mapped[str] = mapped_column(String(16))  # grant | refuse
    card_hours: Mapped[float] = mapped_column(Float, default=0.0)
    experiments: Mapped[int] = mapped_column(Integer, default=0)
    who: Mapped[str] = mapped_column(String(120))
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]

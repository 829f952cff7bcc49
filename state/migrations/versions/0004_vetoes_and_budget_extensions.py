"""a person's veto of a change (and a deny of the authorisation table) remembered with its conditions; budget
extensions granted or refused; the budget and deadline an approval was given under

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "vetoes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("goal_id", sa.String(length=64), sa.ForeignKey("goals.id"), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=True),
        sa.Column("scenario", sa.String(length=200), nullable=False),
        sa.Column("knob", sa.String(length=80), nullable=True),
        sa.Column("value_key", sa.String(length=200), nullable=True),
        sa.Column("parent_hash", sa.String(length=64), nullable=False),
        sa.Column("data_version", sa.String(length=200), nullable=True),
        sa.Column("source_identity", sa.String(length=200), nullable=True),
        sa.Column("source", sa.String(length=24), nullable=False),
        sa.Column("who", sa.String(length=120), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_vetoes_goal_id", "vetoes", ["goal_id"])
    op.create_table(
        "budget_extensions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("goal_id", sa.String(length=64), sa.ForeignKey("goals.id"), nullable=False),
        sa.Column("decision", sa.String(length=16), nullable=False),
        sa.Column("card_hours", sa.Float(), nullable=False),
        sa.Column("experiments", sa.Integer(), nullable=False),
        sa.Column("who", sa.String(length=120), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_budget_extensions_goal_id", "budget_extensions", ["goal_id"])
    with op.batch_alter_table("approvals", schema=None) as batch_op:
        batch_op.add_column(sa.Column("context", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("approvals", schema=None) as batch_op:
        batch_op.drop_column("context")
    op.drop_index("ix_budget_extensions_goal_id", table_name="budget_extensions")
    op.drop_table("budget_extensions")
    op.drop_index("ix_vetoes_goal_id", table_name="vetoes")
    op.drop_table("vetoes")

"""work queue of the service (state/workqueue.py): one row per goal, claimed by a worker

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "work_items",
        sa.Column("goal_id", sa.String(length=64), sa.ForeignKey("goals.id", ondelete="CASCADE"), nullable=False),
        sa.Column("target", sa.String(length=120), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("gen", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("woken_by", sa.String(length=200), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("goal_id"),
    )
    op.create_index("ix_work_items_target", "work_items", ["target"])


def downgrade() -> None:
    op.drop_index("ix_work_items_target", table_name="work_items")
    op.drop_table("work_items")

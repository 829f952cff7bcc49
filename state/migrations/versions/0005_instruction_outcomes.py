"""every instruction ends in a recorded outcome (done, superseded by N, refused because ...) and when

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instructions") as b:
        b.add_column(sa.Column("outcome", sa.Text(), nullable=True))
        b.add_column(sa.Column("outcome_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("instructions") as b:
        b.drop_column("outcome_at")
        b.drop_column("outcome")

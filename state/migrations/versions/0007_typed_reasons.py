"""what a waiting goal waits for, and an instruction's outcome kind and superseding instruction, as columns: code
branches on these, never on the words of a status reason or an outcome

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# the kinds of the rows written before this revision, read once from the words they were written with
OUTCOME_KINDS = (("done:%", "done"), ("not done:%", "not done"), ("failed:%", "failed"), ("refused:%", "refused"),
                 ("superseded by %", "superseded"))


def upgrade() -> None:
    with op.batch_alter_table("goals") as b:
        b.add_column(sa.Column("waiting_for", sa.String(length=24), nullable=True))
    with op.batch_alter_table("instructions") as b:
        b.add_column(sa.Column("outcome_kind", sa.String(length=24), nullable=True))
        b.add_column(sa.Column("superseded_by", sa.Integer(), nullable=True))
    op.execute("UPDATE goals SET waiting_for = 'budget_extension' WHERE status = 'waiting' "
               "AND status_reason LIKE 'waiting for a budget extension%'")
    op.execute("UPDATE goals SET waiting_for = 'approval' WHERE status = 'waiting' AND waiting_for IS NULL")
    for pattern, kind in OUTCOME_KINDS:
        op.execute(sa.text("UPDATE instructions SET outcome_kind = :kind WHERE outcome LIKE :pattern")
                   .bindparams(kind=kind, pattern=pattern))


def downgrade() -> None:
    with op.batch_alter_table("instructions") as b:
        b.drop_column("superseded_by")
        b.drop_column("outcome_kind")
    with op.batch_alter_table("goals") as b:
        b.drop_column("waiting_for")

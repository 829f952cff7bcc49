"""who gave an approval, as a column: a person, the authorisation table's `auto`, or --auto-approve; the report and
the API count the loop's own approvals apart by this column, never by the words of the approval's reason or approver

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("approvals") as b:
        b.add_column(sa.Column("given_by", sa.String(length=16), nullable=False, server_default="person"))
    # the rows written before this revision, read once from the words they were written with (agent/loop/approval.py:
    # the table's reason "authorisation table: ...", the flag's approver "<who> (--auto-approve)")
    op.execute("UPDATE approvals SET given_by = 'flag' WHERE decision = 'approve' AND who LIKE '%(--auto-approve)'")
    op.execute("UPDATE approvals SET given_by = 'table' WHERE decision = 'approve' AND given_by = 'person' "
               "AND reason LIKE 'authorisation table:%'")


def downgrade() -> None:
    with op.batch_alter_table("approvals") as b:
        b.drop_column("given_by")

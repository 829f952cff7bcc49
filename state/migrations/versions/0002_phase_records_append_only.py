"""phase records are append-only: the database itself refuses UPDATE and DELETE

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""
from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

MESSAGE = "phase_records are append-only"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"""
            CREATE FUNCTION phase_records_append_only() RETURNS trigger AS $$
            BEGIN RAISE EXCEPTION '{MESSAGE}'; END; $$ LANGUAGE plpgsql""")
        for what in ("UPDATE", "DELETE"):
            op.execute(f"CREATE TRIGGER phase_records_no_{what.lower()} BEFORE {what} ON phase_records "
                       "FOR EACH ROW EXECUTE FUNCTION phase_records_append_only()")
        return
    for what in ("UPDATE", "DELETE"):
        op.execute(f"CREATE TRIGGER phase_records_no_{what.lower()} BEFORE {what} ON phase_records "
                   f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END")


def downgrade() -> None:
    for what in ("update", "delete"):
        op.execute(f"DROP TRIGGER IF EXISTS phase_records_no_{what} ON phase_records"
                   if op.get_bind().dialect.name == "postgresql" else f"DROP TRIGGER IF EXISTS phase_records_no_{what}")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS phase_records_append_only()")

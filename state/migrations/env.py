"""Alembic environment for the state store, configured in code by state.migrate (no alembic.ini)."""
from __future__ import annotations

from alembic import context

from state.tables import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    connection = config.attributes["connection"]
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("state migrations run online only (Store(url) upgrades on open)")
run_migrations_online()

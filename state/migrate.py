"""Schema migrations run in code: `upgrade(engine)` brings any database to Alembic head.

Several processes may open one store at once, so the upgrade is serialised: an advisory lock on
PostgreSQL, a file lock beside the SQLite file.
"""
from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, text

MIGRATIONS = Path(__file__).with_name("migrations")
_PG_LOCK_KEY = 0x7475_6E65  # "tune"


def alembic_config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@contextmanager
def _sqlite_file_lock(engine: Engine) -> Iterator[None]:
    db = engine.url.database
    if not db or db == ":memory:":
        yield
        return
    with open(Path(db).with_suffix(Path(db).suffix + ".migrate-lock"), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def upgrade(engine: Engine) -> None:
    """Run `alembic upgrade head` on this database, one process at a time."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
            conn.commit()
            try:
                command.upgrade(alembic_config(conn), "head")
                conn.commit()
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
                conn.commit()
        return
    with _sqlite_file_lock(engine), engine.connect() as conn:
        command.upgrade(alembic_config(conn), "head")
        conn.commit()

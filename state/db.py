"""Engine and transactions of the store: SQLite (one file, several processes) or PostgreSQL.

SQLite: WAL with synchronous=FULL (every commit is on disk before it returns), a busy timeout, foreign keys,
and write transactions opened with BEGIN IMMEDIATE so
that a read-check-write (a lease, an approval) holds the write lock from its first read.
PostgreSQL: READ COMMITTED plus row locks (SELECT ... FOR UPDATE) where a check must hold.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import Engine, create_engine, event, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from core.canonical import canon, dumps  # noqa: F401  (the store's JSON: the one canonical form)
from state.errors import NotFound

BUSY_TIMEOUT_MS = 30_000
MAX_ID = 2**63 - 1
# connections per process: SQLite readers run in parallel under WAL (a connection costs a file handle); PostgreSQL's
# cost a server backend each, so a process keeps a few and opens more only for bursts
SQLITE_POOL, SQLITE_OVERFLOW = 8, 32
PG_POOL, PG_OVERFLOW = 5, 15  # the largest integer key either backend stores


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def make_engine(url: str) -> Engine:
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        memory = u.database in (None, "", ":memory:")
        if not memory:
            Path(u.database).parent.mkdir(parents=True, exist_ok=True)
        kw: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000}}
        if memory:
            kw["poolclass"] = StaticPool
        else:  # sized for the API's thread pool: readers never queue behind five connections (WAL: they do not block)
            kw.update(pool_size=SQLITE_POOL, max_overflow=SQLITE_OVERFLOW)
        engine = create_engine(u, json_serializer=dumps, **kw)
        _sqlite_events(engine, wal=not memory)
        return engine
    return create_engine(u, json_serializer=dumps, pool_pre_ping=True, pool_size=PG_POOL, max_overflow=PG_OVERFLOW)


def _sqlite_events(engine: Engine, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _rec: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (pysqlite's own handling is too lazy)
        cur = dbapi_conn.cursor()
        if wal:
            cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=FULL")  # WAL + FULL: a committed approval or ledger row survives power loss
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("immediate") else "BEGIN")


class Database:
    """Owns the engine; hands out short transactions. Write transactions take the write lock early."""

    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        self._writer = self.engine.execution_options(immediate=True)
        self._stamp_conn: Any = None
        self.local_writes = 0  # write transactions this process committed
        self._stamp_lock = threading.Lock()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as s, s.begin():
            yield s

    @contextmanager
    def write(self) -> Iterator[Session]:
        with Session(self._writer, expire_on_commit=False) as s, s.begin():
            yield s
        self.local_writes += 1  # committed (caches of this process compare it: api/readcache.py)

    def change_stamp(self) -> Any:
        """A value that differs after any commit to the database by anyone (this process or another), for caches
        of what is read from it: SQLite's `PRAGMA data_version` on a connection of its own that never writes,
        PostgreSQL's current WAL position (a commit always advances it). Read it before reading what it guards.
        None for an in-memory SQLite database (one shared connection: nothing to compare against)."""
        if isinstance(self.engine.pool, StaticPool):
            return None
        with self._stamp_lock:
            if self._stamp_conn is None:
                self._stamp_conn = self.engine.raw_connection()
                if self.dialect == "postgresql":
                    self._stamp_conn.driver_connection.autocommit = True
            try:
                cur = self._stamp_conn.cursor()
                cur.execute("PRAGMA data_version" if self.dialect == "sqlite" else "SELECT pg_current_wal_lsn()")
                (value,) = cur.fetchone()
                cur.close()
                return value
            except Exception:
                self._stamp_conn.invalidate()  # a dropped connection: a fresh one next time
                self._stamp_conn = None
                raise

    def dispose(self) -> None:
        with self._stamp_lock:
            if self._stamp_conn is not None:
                self._stamp_conn.close()
                self._stamp_conn = None
        self.engine.dispose()


def snap(model: type, row: Any) -> Any:
    """A frozen snapshot of an ORM row."""
    return model.model_validate(row, from_attributes=True)


def get_row(s: Session, table: type, key: Any, what: str, lock: bool = False) -> Any:
    """The row with this primary key (locked FOR UPDATE when asked), or NotFound naming it."""

    if isinstance(key, int) and not isinstance(key, bool) and not -MAX_ID <= key <= MAX_ID:
        raise NotFound(f"no such {what}: {key!r}")  # beyond any stored id (SQLite and PostgreSQL keys are 64-bit)
    if lock:
        pk = table.__mapper__.primary_key[0]
        row = s.execute(select(table).where(pk == key).with_for_update()).scalar_one_or_none()
    else:
        row = s.get(table, key)
    if row is None:
        raise NotFound(f"no such {what}: {key!r}")
    return row

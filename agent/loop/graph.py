"""Wiring only: the loop's LangGraph graph and its checkpointer (SQLite or PostgreSQL saver)."""
from __future__ import annotations

import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from langgraph.graph import START, StateGraph

from agent.loop.nodes import Loop
from agent.loop.state import LoopState

os.environ.setdefault("LANGGRAPH_STRICT_MSGPACK", "true")


def build_graph(loop: Loop, checkpointer: Any = None) -> Any:
    g = StateGraph(LoopState)
    for name in ("observe", "diagnose", "propose", "authorise", "execute", "judge", "decide", "restore", "stop"):
        g.add_node(name, getattr(loop, name))
    g.add_edge(START, "observe")
    g.set_finish_point("stop")
    return g.compile(checkpointer=checkpointer)


def checkpoint_path(store_url: str) -> str:
    """Checkpoints beside a SQLite store (`x.db` -> `x.db.checkpoints`); same URL for PostgreSQL."""
    if store_url.startswith("sqlite:///"):
        return store_url.removeprefix("sqlite:///") + ".checkpoints"
    return store_url


CHECKPOINT_LOCK = 0x6C67_6370  # "lgcp": with the schema's hash, the advisory lock every caller of the setup shares
LOCK_POLL_S = 0.05


def _migrated(conn: Any, saver_cls: Any) -> bool:
    try:
        row = conn.execute("SELECT max(v) FROM checkpoint_migrations").fetchone()
    except Exception:  # no table yet (or no rights to read it): set up
        return False
    return row is not None and row[0] is not None and row[0] >= len(saver_cls.MIGRATIONS) - 1


def setup_postgres(url: str, timeout_s: float = 300.0) -> None:
    """Create or migrate LangGraph's checkpoint tables one process at a time: `PostgresSaver.setup()`
    run by several workers at once races on CREATE TYPE/TABLE (duplicate-type errors).

    The lock is polled with pg_try_advisory_lock between statements, never waited for inside one: a
    statement blocked on the lock holds a snapshot, and the holder's CREATE INDEX CONCURRENTLY waits for
    every such snapshot to end (a deadlock PostgreSQL does not detect)."""
    import psycopg  # deferred: psycopg, only for a PostgreSQL store
    from langgraph.checkpoint.postgres import (
        PostgresSaver,  # deferred: langgraph's PostgreSQL saver, only for a PostgreSQL store
    )

    with psycopg.connect(url, autocommit=True) as conn:
        if _migrated(conn, PostgresSaver):
            return
        deadline = time.perf_counter_ns() + int(timeout_s * 1e9)
        while not conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(current_schema()))",
                                 (CHECKPOINT_LOCK,)).fetchone()[0]:
            if time.perf_counter_ns() > deadline:
                raise TimeoutError(f"checkpoint setup: another process held the setup lock for over {timeout_s:g} s")
            time.sleep(LOCK_POLL_S)  # outside any statement: holds no snapshot
        try:
            if not _migrated(conn, PostgresSaver):
                with PostgresSaver.from_conn_string(url) as saver:
                    saver.setup()
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s, hashtext(current_schema()))", (CHECKPOINT_LOCK,))


@contextmanager
def checkpointer(store_url: str) -> Iterator[Any]:
    if store_url.startswith(("postgresql", "postgres")):
        from langgraph.checkpoint.postgres import (
            PostgresSaver,  # deferred: langgraph's PostgreSQL saver, only for a PostgreSQL store
        )

        url = store_url.replace("postgresql+psycopg://", "postgresql://")
        setup_postgres(url)
        with PostgresSaver.from_conn_string(url) as saver:
            yield saver
        return

    from langgraph.checkpoint.sqlite import SqliteSaver  # deferred: langgraph's SQLite saver, only for a SQLite store

    path = checkpoint_path(store_url)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


def run_config(goal_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": goal_id}, "recursion_limit": 10_000}

"""Wiring only: the loop's LangGraph graph and its checkpointer (SQLite or PostgreSQL saver)."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from langgraph.graph import START, StateGraph

from agent.nodes import Loop, LoopState

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


@contextmanager
def checkpointer(store_url: str) -> Iterator[Any]:
    if store_url.startswith(("postgresql", "postgres")):
        from langgraph.checkpoint.postgres import PostgresSaver

        url = store_url.replace("postgresql+psycopg://", "postgresql://")
        with PostgresSaver.from_conn_string(url) as saver:
            saver.setup()
            yield saver
        return
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    path = checkpoint_path(store_url)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


def run_config(goal_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": goal_id}, "recursion_limit": 10_000}

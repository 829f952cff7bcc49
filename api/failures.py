"""What a worker does when the loop raises: retry what is transient (bounded), fail the rest clearly.

Re-running the loop is safe: it is store-backed and resumes at the recorded phase (the same property
that lets a killed service continue). Transient = the database or a network peer was briefly
unreachable; anything else (a bug, a refused spec, a missing station, a full disk) is permanent: retrying cannot help.
"""
from __future__ import annotations

import errno
import sqlite3
from typing import TYPE_CHECKING

import httpx
import sqlalchemy.exc as sa_exc

from state.statefile import redact

if TYPE_CHECKING:  # annotations only
    from state.snapshots import Goal

RETRY_POLICY = "loop: stop_after_attempt(settings.loop_attempts), wait_exponential(settings.retry_wait_s, max 30 s)"


def _transient_types() -> tuple[type[BaseException], ...]:

    types: list[type[BaseException]] = [sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError,
                                         ConnectionError, TimeoutError, httpx.TransportError, sqlite3.OperationalError]
    try:
        import psycopg  # deferred: psycopg, only to classify a PostgreSQL error

        types += [psycopg.OperationalError, psycopg.InterfaceError]
    except ImportError:  # psycopg is only needed with PostgreSQL
        pass
    return tuple(types)


def storage_full(e: BaseException) -> str | None:
    """'ENOSPC' / 'EDQUOT' / 'SQLITE_FULL' / 'DiskFull' when the error (or its cause) is a full disk or quota."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return errno.errorcode[e.errno]
        if isinstance(e, sqlite3.OperationalError) and "database or disk is full" in str(e):
            return "SQLITE_FULL"
        if type(e).__name__ == "DiskFull" or getattr(e, "sqlstate", None) == "53100":  # psycopg, PostgreSQL
            return "DiskFull"
        e = getattr(e, "orig", None) or e.__cause__ or e.__context__  # type: ignore[assignment]
    return None


def is_transient(e: BaseException) -> bool:
    """True for errors a second attempt may not meet (lost connections, locked database, timeouts).
    A full disk or quota is permanent: retrying cannot help and may leave more half-written state."""

    if storage_full(e):
        return False
    if isinstance(e, sa_exc.DBAPIError) and e.connection_invalidated:
        return True
    return isinstance(e, _transient_types())


def describe(e: BaseException) -> str:
    """One line for people (API, dashboard, STATE.md, webhooks): the class and message, credentials redacted."""
    msg = " ".join(str(e).split())
    if len(msg) > 400:
        msg = msg[:400] + " …"
    full = storage_full(e)
    if full:
        return redact(msg if msg.startswith("StorageFull") else f"StorageFull ({full}): {msg}")
    return redact(f"{type(e).__name__}: {msg}" if msg else type(e).__name__)


def failure_reason(error: str, attempts: int, worker: str, transient: bool) -> str:
    """The goal's status reason once its loop failed (the API shows the goal as `failed` with it)."""
    kind = f"transient error persisted over {attempts} attempts" if transient else "permanent error"
    return f"failed: {error} ({kind}, worker {worker}); fix the cause, then resume the goal to retry"


def shown_status(goal: Goal, work_failed: bool) -> str:
    """`failed` while the goal's loop failed and nobody resumed it since (the store keeps the goal `stopped`
    with the failure as its reason: the goal lifecycle has no `failed`)."""
    return "failed" if work_failed else goal.status

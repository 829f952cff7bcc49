"""Durable records: SQLite synchronous=FULL, atomic writes that fsync the file and its directory and leave no
temporary file behind, JSONL lines that are never torn by a full disk, records fsynced before the done marker,
and a full disk classed as a permanent, named error (never retried)."""
from __future__ import annotations

import errno
import os
import sqlite3
import stat

import pytest
from pydantic import BaseModel

from core import records as rec


class Line(BaseModel):
    i: int
    text: str = "x" * 40


def _fsyncs(monkeypatch) -> list[tuple[str, bool]]:
    """Record every fsync as (path, is_directory) while still doing it."""
    seen: list[tuple[str, bool]] = []
    real = os.fsync

    def spy(fd: int) -> None:
        seen.append((os.readlink(f"/proc/self/fd/{fd}"), stat.S_ISDIR(os.fstat(fd).st_mode)))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return seen


def test_write_atomic_fsyncs_the_file_then_its_directory(tmp_path, monkeypatch):
    seen = _fsyncs(monkeypatch)
    rec.write_atomic(tmp_path / "a.json", "{}\n")
    assert (tmp_path / "a.json").read_text() == "{}\n"
    assert seen[-1] == (str(tmp_path), True)  # the rename itself is on disk
    assert seen[0][0].startswith(str(tmp_path / ".a.json.")) and not seen[0][1]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_write_atomic_on_a_full_disk_names_it_keeps_the_old_file_and_removes_the_temp(tmp_path, monkeypatch, code):
    target = tmp_path / "state.json"
    target.write_text("old\n")

    def full(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(rec.StorageFull, match=rf"StorageFull \({errno.errorcode[code]}\): .* writing {target}"):
        rec.write_atomic(target, "new content\n")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temporary file left


def test_write_atomic_removes_the_temp_on_any_failure(tmp_path, monkeypatch):
    def boom(a, b):
        raise PermissionError(errno.EACCES, "denied")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(PermissionError):
        rec.write_atomic(tmp_path / "x", "y")
    assert list(tmp_path.iterdir()) == []


def test_a_jsonl_line_the_disk_cannot_take_is_cut_back_off(tmp_path, monkeypatch):
    path = tmp_path / rec.REQUESTS
    w = rec.JsonlWriter(path)
    w.write(Line(i=1))
    good = path.read_bytes()
    real = os.write
    calls = {"n": 0}

    def half_then_full(fd: int, data) -> int:  # the disk takes part of the line, then is full
        calls["n"] += 1
        if calls["n"] == 1:
            return real(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(rec.StorageFull, match="ENOSPC"):
        w.write(Line(i=2))
    monkeypatch.setattr(os, "write", real)
    assert path.read_bytes() == good  # no torn line
    w.write(Line(i=3))
    w.close()
    assert [r.i for r in rec.read_jsonl(path, Line)] == [1, 3]


def test_records_are_fsynced_before_rc_and_the_done_marker(tmp_path, monkeypatch):
    with rec.JsonlWriter(tmp_path / rec.REQUESTS) as w:
        w.write(Line(i=1))
    (tmp_path / rec.METRICS).write_text("")  # written by another process (the sim engine, a loader share)
    seen = _fsyncs(monkeypatch)
    rec.mark_done(tmp_path, 0)
    paths = [p for p, _ in seen]
    first_marker = min(i for i, p in enumerate(paths) if "/.rc." in p or "/.done." in p)
    jsonl = {i for i, p in enumerate(paths) if p.endswith(".jsonl")}
    assert {str(tmp_path / rec.REQUESTS), str(tmp_path / rec.METRICS)} <= {paths[i] for i in jsonl}
    assert max(jsonl) < first_marker
    assert (tmp_path / rec.DONE).exists() and (tmp_path / rec.RC).read_text() == "0\n"


def test_sqlite_store_commits_with_synchronous_full(tmp_path):
    from state.store import Store

    s = Store(f"sqlite:///{tmp_path / 't.db'}")
    try:
        with s._db.engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
            assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        s.close()


def test_a_full_disk_is_permanent_and_named():
    import sqlalchemy.exc as sa_exc

    from api.failures import describe, is_transient

    full = rec.StorageFull(errno.ENOSPC, "No space left on device writing /r/spec.json")
    assert not is_transient(full) and describe(full) == "StorageFull (ENOSPC): No space left on device writing /r/spec.json"
    raw = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert not is_transient(raw) and describe(raw).startswith("StorageFull (EDQUOT)")
    db_full = sa_exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database or disk is full"))
    assert not is_transient(db_full) and "StorageFull (SQLITE_FULL)" in describe(db_full)
    locked = sa_exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked"))
    assert is_transient(locked)  # a busy database is still retried

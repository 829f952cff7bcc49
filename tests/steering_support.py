"""Helpers shared by the steering tests: a real `tuneloop serve`, REST and chat calls, CLI processes, CPU time."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from test_api_support import ROOT, ServerProcess, auth, service_env, small_goal, wait_until  # noqa: F401 (re-exported)

from state.workqueue import QueueStore  # noqa: F401 (re-exported: what the steering tests share comes from here)

WAIT_WINDOW_S = 30.0  # the window of waiting for a person
MAX_CPU_SHARE = 0.05


@pytest.fixture
def served(tmp_path):
    db = f"sqlite:///{tmp_path / 't.db'}"
    srv = ServerProcess(tmp_path, service_env(tmp_path, db, TUNELOOP_POLL_S="0.5"))
    srv.db = db  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.stop()


def get(srv, path: str, role: str = "viewer"):
    r = httpx.get(srv.url + path, headers=auth(role), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def post(srv, path: str, body: dict | None = None, role: str = "approver", code: int | None = None):
    r = httpx.post(srv.url + path, json=body, headers=auth(role), timeout=30)
    if code is not None:
        assert r.status_code == code, r.text
    return r


def say(srv, gid: str, text: str) -> dict:
    return post(srv, f"/goals/{gid}/chat", {"text": text}, code=200).json()


def awaiting(srv, gid: str, not_in: set[int] = frozenset()) -> list[dict]:
    return [c for c in get(srv, f"/goals/{gid}/candidates?awaiting=true") if c["id"] not in not_in]


def tuneloop(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")} | {"PYTHONPATH": str(ROOT),
                                                                                     "TUNELOOP_RUNS_ROOT": str(tmp / "runs")}
    return subprocess.run([sys.executable, "-m", "tuneloop_cli", *args], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=600)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of a process and its live children (`tuneloop serve`'s API and worker
    processes), from /proc."""
    total = 0
    for p in Path("/proc").iterdir():
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split() if p.name.isdigit() else None
        except OSError:
            continue
        if fields and (int(p.name) == pid or int(fields[1]) == pid):
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def change(card: dict) -> tuple:
    """What a card proposes from its parent: every change (a pair's two, a twin's jump's several: the changes
    together are what a person rejects, a subset of them is another card)."""
    k = card["card"]
    chs = tuple((c["knob"], c["new"]) for c in (k["change"], k.get("also"), *(k.get("more") or ())) if c)
    return (k["parent_knobs_hash"], chs, k["stage"])



"""Reports: the goal's full report (self-contained HTML, its Markdown twin and images), a plain-text
summary, and its STATE.md. Report files are written under the service's reports folder, never the CWD."""
from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse

from agent.report import render_report
from agent.report.kpis import kpi_lines
from api.auth import Viewer
from api.deps import ServiceDep, StoreDep
from state.statefile import render_state

router = APIRouter(tags=["reports"])
_LOCKS: dict[str, threading.Lock] = {}
_GUARD = threading.Lock()


_RENDERED: dict[str, tuple[Any, Any]] = {}  # goal id -> (the store's change stamp it was rendered at, its paths)


def write_goal_report(svc: Any, goal_id: str) -> Any:
    """The report's paths (agent.report), rendered from the store once per change of the store (its change
    stamp): a dashboard reloading it renders nothing new while the store stands still. One writer per goal."""

    svc.store.get_goal(goal_id)  # 404 before anything is written
    with _GUARD:
        lock = _LOCKS.setdefault(goal_id, threading.Lock())
    with lock:
        stamp = svc.store.change_stamp()  # read before the store is: a commit meanwhile renders again next time
        done = _RENDERED.get(goal_id)
        if stamp is not None and done is not None and done[0] == stamp and Path(done[1].html).is_file() \
                and Path(done[1].markdown).is_file():
            return done[1]
        paths = render_report(svc.store, goal_id, svc.reports_dir / goal_id, base=svc.base)
        _RENDERED[goal_id] = (stamp, paths)
        return paths


@router.get("/goals/{goal_id}/report", response_class=HTMLResponse,
            responses={200: {"content": {"text/html": {}}, "description": "the self-contained report (no network)"}})
def report(goal_id: str, svc: ServiceDep, _: Viewer) -> FileResponse:
    """The goal's report as one self-contained HTML page (plots embedded), rendered from the store now."""
    paths = write_goal_report(svc, goal_id)
    return FileResponse(paths.html, media_type="text/html; charset=utf-8")


@router.get("/goals/{goal_id}/report.md", response_class=PlainTextResponse,
            responses={200: {"content": {"text/markdown": {}}, "description": "the Markdown twin"}})
def report_markdown(goal_id: str, svc: ServiceDep, _: Viewer) -> FileResponse:
    """The Markdown twin; its relative image links (`images/<name>.png`) resolve to the route below."""
    paths = write_goal_report(svc, goal_id)
    return FileResponse(paths.markdown, media_type="text/markdown; charset=utf-8")


@router.get("/goals/{goal_id}/images/{name}", response_class=FileResponse,
            responses={200: {"content": {"image/png": {}}, "description": "one plot of the report"}})
def report_image(goal_id: str, name: str, svc: ServiceDep, _: Viewer) -> FileResponse:
    """One plot of the last rendered report (`<name>.png`, as the Markdown twin links it)."""
    svc.store.get_goal(goal_id)
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,96}\.png", name) or name.startswith("."):  # never a path too long
        raise HTTPException(404, f"no report image {name!r}")
    path = svc.reports_dir / goal_id / "images" / name
    if not path.is_file():
        paths = write_goal_report(svc, goal_id)  # not rendered yet since the service started
        path = Path(paths.dir) / "images" / name
        if not path.is_file():
            raise HTTPException(404, f"the report of {goal_id} has no image {name!r}")
    return FileResponse(path, media_type="image/png")


@router.get("/goals/{goal_id}/summary", response_class=PlainTextResponse)
def summary(goal_id: str, store: StoreDep, _: Viewer) -> str:
    """Decisions, best station and loop KPIs as plain text (what `tuneloop run` prints at the end)."""

    g = store.get_goal(goal_id)
    lines = [f"goal {g.id}: {g.status} — {g.status_reason or ''}"]
    lines += [f"  [{d.kind}] {d.text}" for d in store.decisions(goal_id) if d.kind != "note" or "fallback" in (d.data or {})]
    best = store.best_station(goal_id)
    if best is not None:
        lines.append(f"best station {best.hash}: restore with `tuneloop restore {best.hash}`")
    return "\n".join(lines + kpi_lines(store, goal_id))


@router.get("/goals/{goal_id}/state", response_class=PlainTextResponse)
def state_file(goal_id: str, store: StoreDep, _: Viewer) -> str:
    """The short state file (STATE.md) as the loop reads it."""

    store.get_goal(goal_id)
    return render_state(store, goal_id)

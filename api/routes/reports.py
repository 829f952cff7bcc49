"""Reports: the goal's summary (the report module's when it exists) and its STATE.md."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from api.auth import Viewer
from api.deps import StoreDep

router = APIRouter(tags=["reports"])


@router.get("/goals/{goal_id}/report", response_class=PlainTextResponse)
def report(goal_id: str, store: StoreDep, _: Viewer) -> str:
    """Decisions, best station, KPIs (and the full report's path when the report module exists)."""
    from agent.runcli import summary_text
    from agent.session import SessionResult

    g = store.get_goal(goal_id)
    return summary_text(SessionResult(g.id, g.status, g.status_reason or ""), store.url)


@router.get("/goals/{goal_id}/state", response_class=PlainTextResponse)
def state_file(goal_id: str, store: StoreDep, _: Viewer) -> str:
    """The short state file (STATE.md) as the loop reads it."""
    from state.statefile import render_state

    store.get_goal(goal_id)
    return render_state(store, goal_id)

"""Stations: the best, the valid frontier (JSON and a PNG plot), one station, restore (queued for the loop)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import Response

from agent.report.build import frontier_axes, frontier_plot
from agent.report.content import gather
from api import actions
from api.auth import Admin, Viewer
from api.deps import ServiceDep, StoreDep, ViaDep
from api.routes.goals import instruction_out
from api.schemas import BestOut, FigureOut, FrontierAxis, FrontierPoint, InstructionOut, StationOut
from core.goalview import GoalView
from core.summary import Summary

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store

router = APIRouter(tags=["stations"])


def figures_out(view: GoalView, s: Summary | None) -> list[FigureOut]:
    """The goal view's figures of a run (each limit at its own statistic, then the reported ones)."""
    return [FigureOut(key=f.key, words=f.words, value=f.read(s), limit_ms=f.limit_ms) for f in view.columns()]


def frontier_points(store: Store, goal_id: str) -> list[FrontierPoint]:
    n_of = {r.id: r.n for r in store.runs(goal_id)}
    view = store.get_goal(goal_id).spec.view()
    out = []
    for d in store.frontier(goal_id):
        res = store.get_result(d.run_id) if d.run_id else None
        s = res.result.summary if res else None
        out.append(FrontierPoint(decision=d.kind, run_id=d.run_id, station_hash=d.station_hash, n=n_of.get(d.run_id or ""),
                                 whole=view.objective(s, "whole"), native=view.objective(s, "native"),
                                 figures=figures_out(view, s), text=d.text))
    return out


@router.get("/goals/{goal_id}/best", response_model=BestOut | None)
def best(goal_id: str, store: StoreDep, _: Viewer) -> Any:
    """The current deployable best station (never a quality-pending one) with its objective figure and N, the
    goal's SLO in words and each of its figures the goal limits or reports, or null."""
    goal = store.get_goal(goal_id)
    d = store.best(goal_id)
    if d is None or not d.station_hash:
        return None
    st = StationOut.model_validate(store.get_station(d.station_hash), from_attributes=True)
    res = store.get_result(d.run_id) if d.run_id else None
    s = res.result.summary if res else None
    obj, view = goal.spec.objective, goal.spec.view()
    return BestOut(**st.model_dump(), decision=d.kind, run_id=d.run_id, n=s.n_formal if s else None,
                   objective_metric=obj.metric, objective_window=obj.window,
                   objective=obj.value(s) if s else None,
                   whole=view.objective(s, "whole"), native=view.objective(s, "native"),
                   objective_words=view.objective_words, slo=view.slo_words(), figures=figures_out(view, s))


@router.get("/goals/{goal_id}/frontier", response_model=list[FrontierPoint])
def frontier(goal_id: str, store: StoreDep, _: Viewer) -> list[FrontierPoint]:
    """Valid bests and trade-offs, whole and native figures apart, one point per station and N."""
    store.get_goal(goal_id)
    return frontier_points(store, goal_id)


@router.get("/goals/{goal_id}/frontier/axes", response_model=list[FrontierAxis])
def frontier_axes_of(goal_id: str, svc: ServiceDep, _: Viewer) -> list[FrontierAxis]:
    """The goal's frontier plots, as the report draws them (core/goalview.py `axes`): the objective against the
    limit binding at the best run first, then against each other limit, each at its own statistic; a goal without a
    limit, against the latencies it reports. Each with the route of its plot."""
    svc.store.get_goal(goal_id)
    c = gather(svc.store, goal_id, svc.base)
    out = []
    for i, f in enumerate(x for x in frontier_axes(c) if x is not None):
        out.append(FrontierAxis(key=f.key, words=f.words, limit_ms=f.limit_ms, binding=i == 0 and f.limit_ms is not None,
                                png=f"/goals/{goal_id}/frontier.png?axis={f.key}"))
    return out


@router.get("/goals/{goal_id}/frontier.png", response_class=Response,
            responses={200: {"content": {"image/png": {}}, "description": "the frontier plot"}})
def frontier_png(goal_id: str, svc: ServiceDep, _: Viewer,
                 axis: str | None = Query(None, max_length=64, description="a figure key of GET /goals/G/frontier/axes "
                                                                           "(default: the first, the binding limit's)")
                 ) -> Response:
    """A frontier plot of the report (the same function draws both): the goal's objective against the limit binding
    at the best run (or the latency `axis` names), at its own statistic; whole window filled, native hollow, the
    valid frontier per N dashed, the limit as a dotted line, the goal's SLO in the caption; says so before any valid
    run. An `axis` that is not one of the goal's frontier axes is a 422 naming it."""
    svc.store.get_goal(goal_id)
    c = gather(svc.store, goal_id, svc.base)
    try:
        plot = frontier_plot(c, axis)
    except KeyError:
        keys = [f.key for f in frontier_axes(c) if f is not None]
        raise HTTPException(422, [{"loc": ["query", "axis"], "msg": f"not one of this goal's frontier axes: "
                                                                      f"{', '.join(keys) or 'none'}", "type": "value_error"}])
    return Response(plot.png, media_type="image/png")


@router.get("/stations/{station_hash}", response_model=StationOut)
def get_station(station_hash: str, store: StoreDep, _: Viewer) -> StationOut:
    return StationOut.model_validate(store.get_station(station_hash), from_attributes=True)


@router.post("/stations/{station_hash}/restore", response_model=InstructionOut, status_code=status.HTTP_202_ACCEPTED)
def restore(station_hash: str, svc: ServiceDep, who: Admin, via: ViaDep) -> InstructionOut:
    """Go back to this station: queued as a `restore` instruction of the goal that ran it; that goal's worker
    re-deploys it, checks its health and stops, and the decision log shows the result and who asked."""
    goal_id = actions.goal_of_station(svc, station_hash)
    return instruction_out(actions.queue_restore(svc, goal_id, station_hash, who, f"{via}: restore station {station_hash}",
                                                 via))

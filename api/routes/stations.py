"""Stations: the best, the valid frontier (JSON and a PNG plot), one station, restore (queued for the loop)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, status
from fastapi.responses import Response

from agent.report.build import frontier_plot
from agent.report.content import gather
from api import actions
from api.auth import Admin, Viewer
from api.deps import ServiceDep, StoreDep, ViaDep
from api.routes.goals import instruction_out
from api.schemas import BestOut, FrontierPoint, InstructionOut, StationOut

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store

router = APIRouter(tags=["stations"])


def frontier_points(store: Store, goal_id: str) -> list[FrontierPoint]:
    n_of = {r.id: r.n for r in store.runs(goal_id)}
    out = []
    for d in store.frontier(goal_id):
        res = store.get_result(d.run_id) if d.run_id else None
        s = res.result.summary if res else None
        out.append(FrontierPoint(decision=d.kind, run_id=d.run_id, station_hash=d.station_hash, n=n_of.get(d.run_id or ""),
                                 whole=s.whole.output_tok_s_per_card if s and s.whole else None,
                                 native=s.native.output_tok_s_per_card if s and s.native else None,
                                 tpot_mean_ms=s.tpot_ms.mean if s else None, text=d.text))
    return out


@router.get("/goals/{goal_id}/best", response_model=BestOut | None)
def best(goal_id: str, store: StoreDep, _: Viewer) -> Any:
    """The current deployable best station (never a quality-pending one) with its objective figure and N,
    or null."""
    goal = store.get_goal(goal_id)
    d = store.best(goal_id)
    if d is None or not d.station_hash:
        return None
    st = StationOut.model_validate(store.get_station(d.station_hash), from_attributes=True)
    res = store.get_result(d.run_id) if d.run_id else None
    s = res.result.summary if res else None
    obj = goal.spec.objective
    return BestOut(**st.model_dump(), decision=d.kind, run_id=d.run_id, n=s.n_formal if s else None,
                   objective_metric=obj.metric, objective_window=obj.window,
                   objective=obj.value(s) if s else None,
                   whole=s.whole.output_tok_s_per_card if s and s.whole else None,
                   native=s.native.output_tok_s_per_card if s and s.native else None,
                   tpot_mean_ms=s.tpot_ms.mean if s else None, ttft_p90_ms=s.ttft_ms.p90 if s else None)


@router.get("/goals/{goal_id}/frontier", response_model=list[FrontierPoint])
def frontier(goal_id: str, store: StoreDep, _: Viewer) -> list[FrontierPoint]:
    """Valid bests and trade-offs, whole and native figures apart, one point per station and N."""
    store.get_goal(goal_id)
    return frontier_points(store, goal_id)


@router.get("/goals/{goal_id}/frontier.png", response_class=Response,
            responses={200: {"content": {"image/png": {}}, "description": "the frontier plot"}})
def frontier_png(goal_id: str, svc: ServiceDep, _: Viewer) -> Response:
    """The report's throughput-vs-mean-TPOT plot (the same function draws both): whole window filled,
    native hollow, the valid frontier per N dashed, the SLO as a dotted line; says so before any valid run."""

    svc.store.get_goal(goal_id)
    return Response(frontier_plot(gather(svc.store, goal_id, svc.base)).png, media_type="image/png")


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

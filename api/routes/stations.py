"""Stations: the best, the valid frontier (JSON and a PNG plot), one station, restore (queued for the loop)."""
from __future__ import annotations

import io
from typing import Any

from fastapi import APIRouter, status
from fastapi.responses import Response

from api import actions
from api.auth import Admin, Viewer
from api.deps import ServiceDep, StoreDep
from api.schemas import FrontierPoint, InstructionOut, StationOut

router = APIRouter(tags=["stations"])


def frontier_points(store: Any, goal_id: str) -> list[FrontierPoint]:
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


@router.get("/goals/{goal_id}/best", response_model=StationOut | None)
def best(goal_id: str, store: StoreDep, _: Viewer) -> Any:
    """The current deployable best station (never a quality-pending one), or null."""
    store.get_goal(goal_id)
    st = store.best_station(goal_id)
    return StationOut.model_validate(st, from_attributes=True) if st else None


@router.get("/goals/{goal_id}/frontier", response_model=list[FrontierPoint])
def frontier(goal_id: str, store: StoreDep, _: Viewer) -> list[FrontierPoint]:
    """Valid bests and trade-offs, whole and native figures apart, one point per station and N."""
    store.get_goal(goal_id)
    return frontier_points(store, goal_id)


@router.get("/goals/{goal_id}/frontier.png", response_class=Response,
            responses={200: {"content": {"image/png": {}}, "description": "the frontier plot"}})
def frontier_png(goal_id: str, store: StoreDep, _: Viewer) -> Response:
    """Mean TPOT against tok/s/card (native filled, whole hollow), labelled by experiment."""
    import matplotlib  # deferred: matplotlib, only when a plot is asked for

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # deferred: matplotlib, only when a plot is asked for

    store.get_goal(goal_id)
    pts = frontier_points(store, goal_id)
    fig = Figure(figsize=(6, 3.6), dpi=90)
    ax = fig.subplots()
    for p in pts:
        if p.tpot_mean_ms is None:
            continue
        if p.native is not None:
            ax.scatter([p.native], [p.tpot_mean_ms], color="tab:blue")
        if p.whole is not None:
            ax.scatter([p.whole], [p.tpot_mean_ms], facecolors="none", edgecolors="tab:orange")
        x = p.native if p.native is not None else p.whole
        if x is not None:
            ax.annotate(f"{p.decision} N={p.n}", (x, p.tpot_mean_ms), fontsize=7)
    ax.set_xlabel("output tok/s per card (native ●, whole ○)")
    ax.set_ylabel("mean TPOT (ms)")
    ax.set_title(f"frontier of {goal_id}" if pts else f"{goal_id}: no valid result yet", fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return Response(buf.getvalue(), media_type="image/png")


@router.get("/stations/{station_hash}", response_model=StationOut)
def get_station(station_hash: str, store: StoreDep, _: Viewer) -> StationOut:
    return StationOut.model_validate(store.get_station(station_hash), from_attributes=True)


@router.post("/stations/{station_hash}/restore", response_model=InstructionOut, status_code=status.HTTP_202_ACCEPTED)
def restore(station_hash: str, svc: ServiceDep, who: Admin) -> InstructionOut:
    """Go back to this station: queued as a `restore` instruction of the goal that ran it; that goal's worker
    re-deploys it, checks its health and stops, and the decision log shows the result and who asked."""
    goal_id = actions.goal_of_station(svc, station_hash)
    ins = actions.queue_restore(svc, goal_id, station_hash, who, f"api: restore station {station_hash}")
    return InstructionOut.model_validate(ins, from_attributes=True)

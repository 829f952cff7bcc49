"""Experiments (runs): card, phases, figures, verdict, raw-data download."""
from __future__ import annotations

import io
import tarfile
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

from api import actions
from api.auth import Viewer
from api.deps import ServiceDep, StoreDep
from api.schemas import DriftFigureOut, ExperimentOut, PhaseOut
from core.evidence_parts import Drift
from core.goalview import GoalView
from core.summary import Summary

router = APIRouter(tags=["experiments"])


def experiment_out(svc: Any, r: Any) -> ExperimentOut:
    st = svc.store
    res = st.get_result(r.id)
    card = st.get_candidate(r.candidate_id).card if r.candidate_id else None
    summary = res.result.summary.model_dump(mode="json") if res and res.result.summary else None
    return ExperimentOut(id=r.id, goal_id=r.goal_id, candidate_id=r.candidate_id, stage=r.stage, n=r.n, target=r.target,
                         status=r.status, status_reason=r.status_reason, station_hash=r.station_hash, card=card,
                         verdict=res.verdict if res else None,
                         verdict_reasons=[x.message for x in res.result.verdict.reasons] if res else [],
                         figures=actions.figures(svc, r.id), summary=summary, run_dir=_run_dir(svc, r.id),
                         drift=res.result.evidence.drift if res else None,
                         drift_figures=drift_figures(st.get_goal(r.goal_id).spec.view() if r.goal_id else None,
                                                     res.result.evidence.drift if res else None,
                                                     res.result.summary if res else None))


def drift_figures(view: GoalView | None, d: Drift | None, measured: Summary | None) -> list[DriftFigureOut]:
    """The goal's own figures of a run with a drift record: its objective in its window, then each limit at its
    statistic and each reported figure (core/goalview.py), predicted by the calibrated simulator beside measured. A
    record written before the predicted Summary was kept gives only its own two figures (output tok/s in the whole
    window, mean TPOT) where the goal names them."""
    if view is None or d is None or d.error:
        return []

    def predicted(key: str, read: Any) -> float | None:
        if d.summary is not None:
            return read(d.summary)
        own = key == "tpot_mean_ms" or (key == "output_tok_s" and view.window == "whole")
        return getattr(d.predicted, key, None) if own and d.predicted is not None else None

    rows = [(view.metric, view.objective_words, None, lambda s: view.objective(s))]
    rows += [(f.key, f.words, f.limit_ms, f.read) for f in view.columns()]
    out = []
    for key, words, limit, read in rows:
        p, m = predicted(key, read), read(measured)
        out.append(DriftFigureOut(key=key, words=words, predicted=p, measured=m, limit_ms=limit,
                                  drift=p / m - 1.0 if p is not None and m else None))
    return out


def _run_dir(svc: Any, run_id: str) -> str | None:
    d = (svc.base / svc.settings.runs_root / run_id).resolve()
    return str(d) if d.is_dir() else None


@router.get("/goals/{goal_id}/experiments", response_model=list[ExperimentOut])
def list_experiments(goal_id: str, svc: ServiceDep, _: Viewer) -> list[ExperimentOut]:
    svc.store.get_goal(goal_id)
    return [experiment_out(svc, r) for r in svc.store.runs(goal_id)]


@router.get("/experiments/{run_id}", response_model=ExperimentOut)
def get_experiment(run_id: str, svc: ServiceDep, _: Viewer) -> ExperimentOut:
    return experiment_out(svc, svc.store.get_run(run_id))


@router.get("/experiments/{run_id}/phases", response_model=list[PhaseOut])
def phases(run_id: str, store: StoreDep, _: Viewer) -> list[PhaseOut]:
    store.get_run(run_id)
    return [PhaseOut.model_validate(p, from_attributes=True) for p in store.phases(run_id)]


@router.get("/experiments/{run_id}/raw", response_class=Response,
            responses={200: {"content": {"application/gzip": {}}, "description": "the run directory as .tar.gz"}})
def raw(run_id: str, svc: ServiceDep, _: Viewer) -> Response:
    """The run's raw data (records, samples, spec, result) as a tar.gz of its run directory."""
    svc.store.get_run(run_id)
    root = svc.settings.runs_root.resolve()
    d = (root / run_id).resolve()
    if root not in d.parents or not d.is_dir():
        raise HTTPException(404, f"no raw data for run {run_id!r} under this service's runs root")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(d, arcname=run_id)
    return Response(buf.getvalue(), media_type="application/gzip",
                    headers={"Content-Disposition": f'attachment; filename="{run_id}.tar.gz"'})

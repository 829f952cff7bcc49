"""Liveness and the service's own Prometheus metrics (no token: scrapers and probes)."""
from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from api.deps import ServiceDep
from api.failures import shown_status
from state.lifecycle import GoalStatus
from state.workqueue import WorkState

router = APIRouter(tags=["health"])
REGISTRY = CollectorRegistry()
REQUESTS = Counter("tuneloop_api_requests_total", "API requests by route template, method and status",
                   ["route", "method", "status"], registry=REGISTRY)
GOALS = Gauge("tuneloop_goals", "goals by status", ["status"], registry=REGISTRY)
WORK = Gauge("tuneloop_work_items", "work-queue items by state", ["state"], registry=REGISTRY)
WEBHOOKS = Gauge("tuneloop_webhooks_total", "webhook deliveries by outcome", ["outcome"], registry=REGISTRY)


@router.get("/health")
def health(svc: ServiceDep) -> dict[str, Any]:
    """200 while the store answers; the workers alive on this store, wherever they run (`tuneloop serve` runs
    them in a process of its own; a `tuneloop worker` elsewhere counts too: each writes its presence at least
    every third of a claim's TTL), this process's id and its own worker threads; never any secret."""
    n = len(svc.store.goals())
    alive = svc.store.workers_alive(svc.settings.claim_ttl_s)
    return {"status": "ok", "goals": n, "workers": len(alive), "worker_names": alive,
            "workers_in_this_process": sum(t.is_alive() for t in svc.threads), "pid": os.getpid(),
            "backend": svc.store.url.split(":", 1)[0]}


@router.get("/metrics", response_class=Response)
def metrics(svc: ServiceDep) -> Response:
    counts: dict[str, int] = {}
    failed = {w.goal_id for w in svc.store.work_items() if w.state == WorkState.FAILED}
    for g in svc.store.goals():
        st = shown_status(g, g.id in failed)
        counts[st] = counts.get(st, 0) + 1
    for s in (*GoalStatus, WorkState.FAILED):  # a goal shown "failed": its work item failed for good
        GOALS.labels(s).set(counts.get(s, 0))
    states: dict[str, int] = {}
    for w in svc.store.work_items():
        states[w.state] = states.get(w.state, 0) + 1
    for s in WorkState:
        WORK.labels(s).set(states.get(s, 0))
    WEBHOOKS.labels("sent").set(svc.notifier.sent)
    WEBHOOKS.labels("failed").set(svc.notifier.failed)
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

"""Budget: card-hours and experiments used and left; extensions a person grants or refuses."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, status
from pydantic import BaseModel, ConfigDict, Field

from api import actions
from api.auth import Approver, Viewer
from api.deps import ServiceDep, StoreDep, ViaDep
from api.schemas import BudgetOut, Reason
from state.steering import MAX_EXTENSION_CARD_HOURS, MAX_EXTENSION_EXPERIMENTS

router = APIRouter(tags=["budget"])


class ExtensionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    card_hours: float = Field(ge=0, le=MAX_EXTENSION_CARD_HOURS, description="card-hours added to the budget")
    experiments: int | None = Field(None, ge=0, le=MAX_EXTENSION_EXPERIMENTS,
                                    description="experiments added (default: as many as the loop asked for)")
    reason: Reason | None = None


class RefuseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: Reason = Field(description="why the extension is refused (the goal stops with it)")


class ExtensionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    goal_id: str
    decision: str
    card_hours: float
    experiments: int
    who: str
    reason: str | None = None
    created_at: datetime


class ExtensionsOut(BaseModel):
    asked: dict[str, Any] | None = Field(None, description="the extension the loop waits for: card_hours, "
                                                           "experiments, candidate_id, why (null when none)")
    extensions: list[ExtensionOut]


@router.get("/goals/{goal_id}/budget", response_model=BudgetOut)
def budget(goal_id: str, store: StoreDep, _: Viewer) -> BudgetOut:
    return budget_out(store.budget(goal_id))


def budget_out(b: Any) -> BudgetOut:
    """The store's BudgetState as the API shows it."""
    return BudgetOut(card_hours_limit=b.card_hours_limit, card_hours_used=b.card_hours_used,
                     card_hours_left=b.card_hours_left, experiments_limit=b.experiments_limit,
                     experiments_used=b.experiments_used, experiments_left=b.experiments_left, deadline=b.deadline,
                     deadline_passed=b.deadline_passed)


@router.get("/goals/{goal_id}/budget/extensions", response_model=ExtensionsOut)
def list_extensions(goal_id: str, svc: ServiceDep, _: Viewer) -> ExtensionsOut:
    """What the loop asks for (if it waits for an extension) and every extension granted or refused."""
    svc.store.get_goal(goal_id)
    return ExtensionsOut(asked=actions.asked_extension(svc, goal_id),
                         extensions=[ExtensionOut.model_validate(x) for x in svc.store.extensions(goal_id)])


@router.post("/goals/{goal_id}/budget/extensions", response_model=ExtensionOut, status_code=status.HTTP_201_CREATED)
def grant_extension(goal_id: str, body: ExtensionIn, svc: ServiceDep, who: Approver, via: ViaDep) -> ExtensionOut:
    """Add card-hours (and experiments) to the goal's budget, e.g. `{"card_hours": 10}`; the loop waiting for it
    goes on within a poll interval."""
    svc.store.get_goal(goal_id)
    ext = actions.extend_budget(svc, goal_id, who, body.card_hours, body.experiments, body.reason, via=via)
    return ExtensionOut.model_validate(ext)


@router.post("/goals/{goal_id}/budget/extensions/refuse", response_model=ExtensionOut,
             status_code=status.HTTP_201_CREATED, responses={409: {"description": "the goal waits for no extension"}})
def refuse_extension(goal_id: str, body: RefuseIn, svc: ServiceDep, who: Approver, via: ViaDep) -> ExtensionOut:
    """Refuse the extension the loop asked for: the goal stops with this reason."""
    svc.store.get_goal(goal_id)
    return ExtensionOut.model_validate(actions.refuse_extension(svc, goal_id, who, body.reason, via=via))

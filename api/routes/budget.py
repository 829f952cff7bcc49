"""Budget: card-hours and experiments used and left."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.auth import Viewer
from api.deps import StoreDep
from api.schemas import BudgetOut

router = APIRouter(tags=["budget"])


@router.get("/goals/{goal_id}/budget", response_model=BudgetOut)
def budget(goal_id: str, store: StoreDep, _: Viewer) -> BudgetOut:
    return budget_out(store.budget(goal_id))


def budget_out(b: Any) -> BudgetOut:
    """The store's BudgetState as the API shows it."""
    return BudgetOut(card_hours_limit=b.card_hours_limit, card_hours_used=b.card_hours_used,
                     card_hours_left=b.card_hours_left, experiments_limit=b.experiments_limit,
                     experiments_used=b.experiments_used, experiments_left=b.experiments_left, deadline=b.deadline,
                     deadline_passed=b.deadline_passed)

"""Budget ledger: card-hours used and left, estimates of a run's cost, and "affordable".

Costs are seconds × cards per item (restart, weight load, warm-up, load, relayout, profile, collect);
estimates use what this goal's own runs cost so far, with stated defaults before the first run.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict

from core.knobs import COST_ORDER
from state.snapshots import Goal, LedgerEntry, Run

# seconds assumed before this goal has paid for one of these itself
DEFAULT_SECONDS = {"restart": 300.0, "weight_load": 0.0, "warmup": 30.0, "relayout": 900.0, "collect": 10.0,
                   "profile": 120.0}
NEEDS_RESTART = {c for c, rank in COST_ORDER.items() if rank >= COST_ORDER["restart"]}


class BudgetState(BaseModel):
    model_config = ConfigDict(frozen=True)
    card_hours_limit: float
    card_hours_used: float
    experiments_limit: int
    experiments_used: int
    deadline: datetime | None = None
    deadline_passed: bool = False
    by_kind: dict[str, float] = {}  # card-hours per cost item
    extended_card_hours: float = 0.0  # granted by people on top of the goal's own budget (included in the limits)
    extended_experiments: int = 0
    # runs that ended in a tooling fault (the executor or the engine's plumbing failed, not the station): each is
    # retried as a new attempt on this line of its own, bounded per experiment by the planner's MAX_ATTEMPTS, and
    # never counted in `experiments_used` (their card-hours are charged: the cards were held)
    tooling_faults: int = 0

    @property
    def card_hours_left(self) -> float:
        return self.card_hours_limit - self.card_hours_used

    @property
    def experiments_left(self) -> int:
        return self.experiments_limit - self.experiments_used

    def affordable(self, estimated_card_hours: float) -> bool:
        """True when one more experiment of this cost keeps every limit."""
        return (not self.deadline_passed and self.experiments_left >= 1
                and estimated_card_hours <= self.card_hours_left + 1e-12)


TOOLING_FAULTS = ("orchestration_fault", "collection_fault")  # verdicts that are the tooling's, not the station's


def tooling_fault(run: Run) -> bool:
    """Whether a run ended in a tooling fault (its final status reason is such a verdict, agent/loop/nodes.py)."""
    return run.stage != "restore" and run.status in ("done", "failed") and run.status_reason in TOOLING_FAULTS


def tooling_note(budget: BudgetState) -> str:
    """What a stop adds about runs that ended in a tooling fault (empty without one). The loop appends it to the
    stop's reason once, when it records the stop (agent/loop/nodes.py), never to a reason that carries it already."""
    n = budget.tooling_faults
    if not n:
        return ""
    return (f"; {n} run{'s' if n != 1 else ''} ended in a tooling fault, retried on their own line and not counted "
            "in the experiments")


def budget_state(goal: Goal, entries: Iterable[LedgerEntry], runs: Iterable[Run], now: datetime | None = None,
                 extensions: Iterable[Any] = ()) -> BudgetState:
    """Used and left; the limits are the goal's budget plus every extension a person granted. A run that ended in a
    tooling fault is on its own line (`tooling_faults`), not one of the person's experiments."""
    entries, runs = list(entries), list(runs)
    granted = [x for x in extensions if x.decision == "grant"]
    ext_h, ext_n = sum(x.card_hours for x in granted), sum(x.experiments for x in granted)
    by_kind: dict[str, float] = {}
    for e in entries:
        by_kind[e.what] = by_kind.get(e.what, 0.0) + e.card_hours
    deadline = goal.spec.budget.deadline
    now = now or datetime.now(timezone.utc)
    passed = False
    if deadline is not None:
        d = deadline if deadline.tzinfo else deadline.replace(tzinfo=timezone.utc)
        passed = now >= d
    return BudgetState(
        card_hours_limit=goal.spec.budget.card_hours + ext_h,
        card_hours_used=sum(e.card_hours for e in entries),
        experiments_limit=goal.spec.budget.experiments + ext_n,
        experiments_used=sum(1 for r in runs if r.stage != "restore" and not tooling_fault(r)),
        tooling_faults=sum(1 for r in runs if tooling_fault(r)),
        deadline=deadline, deadline_passed=passed, by_kind=by_kind, extended_card_hours=ext_h,
        extended_experiments=ext_n,
    )


def _mean_seconds(entries: list[LedgerEntry], what: str) -> float | None:
    per_run: dict[str, float] = {}
    for e in entries:
        if e.what == what:
            per_run[e.run_id] = per_run.get(e.run_id, 0.0) + e.seconds
    return sum(per_run.values()) / len(per_run) if per_run else None


def estimate(cost_class: str | None, n: int, cards: int, *, request_rate: float | None = None,
             entries: Iterable[LedgerEntry] = (), runs: Iterable[Run] = (), warmup: bool = True) -> float:
    """Estimated card-hours of one run of n requests: restart/relayout if its cost class needs one,
    warm-up, load (seconds per request from past loads, else n / rate), collect."""
    entries = list(entries)
    n_of = {r.id: r.n for r in runs}

    def sec(what: str) -> float:
        got = _mean_seconds(entries, what)
        return DEFAULT_SECONDS.get(what, 0.0) if got is None else got

    total = sec("collect") + (sec("warmup") if warmup else 0.0)
    if cost_class in NEEDS_RESTART:
        total += sec("restart") + sec("weight_load")
    if cost_class == "relayout":
        total += sec("relayout")
    load = [(e.seconds, n_of[e.run_id]) for e in entries if e.what == "load" and n_of.get(e.run_id)]
    if load:
        total += n * sum(s for s, _ in load) / sum(k for _, k in load)
    else:
        rate = request_rate if request_rate and request_rate != float("inf") else 1.0
        total += n / rate * 1.25  # ramp and drain beyond the sending time
    return total * cards / 3600.0


def summarize_ledger(entries: Iterable[LedgerEntry]) -> dict[str, Any]:
    """Card-hours per cost item and in total, for reports and the state file."""
    out: dict[str, float] = {}
    for e in entries:
        out[e.what] = out.get(e.what, 0.0) + e.card_hours
    return {"by_kind": out, "total": sum(out.values())}

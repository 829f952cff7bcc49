"""Where a goal is now: the running experiment, its phase, elapsed time against the planner's estimate,
requests done / N during the load, and the budget used so far. `GET /goals/G`, the dashboard and
`tuneloop run` all show this one reading of the store (plus the runner's `progress.json` during a load).
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from agent.planner import estimate
from agent.loop.record import build_history, card_of
from core.journal import PhaseStatus
from state.lifecycle import RunStatus

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store

OPEN_RUNS = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.UNKNOWN)


class Progress(BaseModel):
    run_id: str
    candidate_id: int | None = None
    title: str = Field(description="the card: stage, N and its one change")
    stage: str
    n: int
    status: str = Field(description="the run's status: pending | running | unknown")
    phase: str | None = Field(None, description="the phase now (lock, prepare, deploy, health, warmup, load, "
                                                "collect, validate, release); None before the first")
    phase_state: str | None = Field(None, description="'started' while the phase runs, else how it ended")
    started_at: datetime | None = None
    clock: Literal["wall", "simulated"] = Field("wall", description="the clock of elapsed_s and expected_s: the "
                                                                    "wall's on a real target, the simulator's "
                                                                    "virtual device seconds on the simulator")
    elapsed_s: float | None = Field(None, description="seconds so far on `clock`: wall seconds since the run's first "
                                                      "phase began; on the simulator the device seconds it charges so "
                                                      "far (restart, warm-up, the load's virtual time), None before "
                                                      "its load noted any")
    expected_s: float | None = Field(None, description="the planner's estimate of this run's device time in seconds "
                                                       "(the card's estimated card-hours over the cards in use), on "
                                                       "the same clock as elapsed_s")
    est_card_hours: float | None = None
    requests_done: int | None = Field(None, description="requests the load has recorded so far (load phase on)")
    requests_total: int | None = Field(None, description="N plus the warm-up requests")
    card_hours_used: float
    card_hours_limit: float
    experiments_used: int
    experiments_limit: int

    def line(self) -> str:
        """One line, as `tuneloop run` shows it."""
        parts = [f"run {self.run_id}", self.title, f"phase {self.phase or '-'}"
                 + (f" ({self.phase_state})" if self.phase_state and self.phase_state != PhaseStatus.STARTED else "")]
        if self.elapsed_s is not None:
            est = f" of ~{self.expected_s:.0f} s device time" if self.expected_s is not None else ""
            parts.append(f"{self.clock} {self.elapsed_s:.0f} s{est}")
        if self.requests_total:
            parts.append(f"requests {self.requests_done if self.requests_done is not None else 0}/{self.requests_total}")
        parts.append(f"budget {self.card_hours_used:.2f}/{self.card_hours_limit:.2f} card-h, "
                     f"{self.experiments_used}/{self.experiments_limit} experiments")
        return " · ".join(parts)


def _aware(t: datetime | None) -> datetime | None:
    return t.replace(tzinfo=timezone.utc) if t is not None and t.tzinfo is None else t


def goal_progress(store: Store, goal_id: str, runs_root: str | Path, now: datetime | None = None) -> Progress | None:
    """The goal's running experiment now, or None when none runs. `runs_root`: the executor's run folder
    (where the runner writes progress.json beside each run's spec)."""
    runs = [r for r in store.runs(goal_id) if r.status in OPEN_RUNS]
    if not runs:
        return None
    run = runs[-1]
    now = now or datetime.now(timezone.utc)
    phases = store.phases(run.id)
    last = phases[-1] if phases else None
    started = _aware(phases[0].at) if phases and phases[0].at else _aware(run.created_at)
    card: dict[str, Any] = {}
    if run.candidate_id is not None:
        card = store.get_candidate(run.candidate_id).card
    title = card_of(card).title() if card else f"{run.stage} N={run.n}"
    est = card_estimate(store, goal_id, card) if card else None
    cards = store.get_goal(goal_id).spec.constraints.cards or 16  # as the cost model counts them
    prep = next((p.detail or {} for p in phases if p.phase == "prepare" and p.event == "outcome"), {})
    clock = "simulated" if prep.get("clock") == "simulated" else "wall"
    note: dict[str, Any] = {}
    if any(p.phase == "load" for p in phases):
        try:  # the runner's note beside the run's spec (run ids are the store's own, card hash based)
            note = json.loads((Path(runs_root) / run.id / "progress.json").read_text())
        except (OSError, ValueError):
            pass
    clock = "simulated" if note.get("clock") == "simulated" else clock
    done = total = None
    if last is not None and last.phase == "load":
        total = run.n + int(run.spec.get("warmup") or 0)
        done, total = note.get("requests_done"), note.get("requests_total") or total
        if last.event == "outcome" and last.status == PhaseStatus.OK:
            done = total  # the load ended; the count is final
    if clock == "simulated":  # the simulator's device seconds, never the wall's beside a device-time estimate
        elapsed = note.get("elapsed_s")
    else:
        elapsed = (now - started).total_seconds() if started else None
    b = store.budget(goal_id)
    return Progress(run_id=run.id, candidate_id=run.candidate_id, title=title, stage=run.stage, n=run.n,
                    status=run.status, phase=last.phase if last else None,
                    phase_state=None if last is None else ("started" if last.event == "intent" else last.status),
                    started_at=started, clock=clock, elapsed_s=elapsed,
                    expected_s=None if est is None else est * 3600.0 / cards, est_card_hours=est,
                    requests_done=done, requests_total=total, card_hours_used=b.card_hours_used,
                    card_hours_limit=b.card_hours_limit, experiments_used=b.experiments_used,
                    experiments_limit=b.experiments_limit)


def _estimate(store: Store, goal_id: str, card: dict[str, Any]) -> float | None:
    """The cost model's card-hours for a card the planner did not price (a reference, an instruction)."""
    try:
        return round(estimate(card_of(card), build_history(store, goal_id)), 4)
    except Exception:  # an estimate is a display aid: a card it cannot price shows none
        return None


class Ranking(BaseModel):
    rank: int | None = Field(None, description="1 = the planner's top-valued card among those it weighed")
    of: int = Field(0, description="how many cards it weighed (the record keeps the top 8)")
    why: str | None = Field(None, description="why this card was chosen (or why it runs first)")


def ranking(card: dict[str, Any]) -> Ranking:
    """The card's place in the planner's ranked alternatives as recorded with it (`ranked`: title, value,
    why or refusals), and the reason given for it (a later 'runs first' entry overrides the value order)."""
    ranked = [r for r in card.get("ranked") or [] if isinstance(r, (list, tuple)) and len(r) == 3]
    try:
        title = card_of(card).title()
    except Exception:  # a stored card this version cannot read: no rank, never an error
        return Ranking(of=len(ranked))
    titles = list(dict.fromkeys(str(r[0]) for r in ranked))
    mine = [r for r in ranked if r[0] == title]
    return Ranking(rank=titles.index(title) + 1 if title in titles else None, of=len(titles),
                   why=str(mine[-1][2]) if mine else None)


def card_estimate(store: Store, goal_id: str, card: dict[str, Any]) -> float | None:
    """Estimated card-hours of a card: the planner's own, else the cost model's."""
    est = card.get("est_card_hours")
    return float(est) if est is not None else _estimate(store, goal_id, card)

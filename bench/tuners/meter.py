"""Device time charged per trial, by the executor's own rules, and the record of one tuner's trials.

`charge` mirrors the sim transport's cost model (`executor.costs.charges` with the profile's fixed costs): a change of server knobs (anything
but concurrency and request_rate) restarts the service and pays restart + weight load + warm-up; a
change whose cost class is `relayout` also pays the relayout; every run pays its load time (virtual
seconds from first send to last completion). All × the cards in use. The benchmark re-charges the
loop's own runs with this function and records whether the totals agree (`charging_check`).
"""
from __future__ import annotations

from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from bench.tuners.evaluate import Eval
from core.profiles import Costs
from core.station import LOAD_KNOBS, change_cost
from core.trial import CostEntry


def charge(costs: Costs, running: dict[str, Any] | None, new: dict[str, Any], load_s: float,
           cards: int) -> list[CostEntry]:
    """CostEntries for running `new` (full knobs) when `running` (full knobs or None) is deployed."""
    out: list[CostEntry] = []
    server = {k: v for k, v in new.items() if k not in LOAD_KNOBS}
    warm = running is not None and {k: v for k, v in running.items() if k not in LOAD_KNOBS} == server
    if not warm:
        out += [CostEntry(what="restart", seconds=costs.restart_s, cards=cards),
                CostEntry(what="weight_load", seconds=costs.weight_load_s, cards=cards),
                CostEntry(what="warmup", seconds=costs.warmup_s, cards=cards)]
        if change_cost(running, new) == "relayout":
            out.append(CostEntry(what="relayout", seconds=costs.relayout_s, cards=cards))
    out.append(CostEntry(what="load", seconds=load_s, cards=cards))
    return out


class Trial(BaseModel):
    """One experiment of one tuner, with the tuner's incumbent after it (its own view of the best)."""

    model_config = ConfigDict(frozen=True)
    index: int  # 1-based experiment count
    knobs: dict[str, Any]  # the search-space point (only the knobs of the space)
    stage: str = "trial"
    n: int
    verdict: str
    objective: float | None = None
    feasible: bool = False
    card_hours: float
    cum_card_hours: float
    restarted: bool
    incumbent: dict[str, Any] | None = None  # point the tuner would deploy now
    incumbent_true: float | None = None  # the oracle's figure for that point (filled by scoring)
    improved: bool = False  # became the tuner's new incumbent
    repeated_negative: bool = False


class Meter:
    """Runs stations for a baseline tuner: measure (cached), charge like the executor, keep the record."""

    def __init__(self, measure: Callable[[dict[str, Any], int], Eval], full: Callable[[dict[str, Any]], dict[str, Any]],
                 base: dict[str, Any], costs: Costs, n: int):
        self.measure, self.full, self.base, self.costs, self.n = measure, full, dict(base), costs, n
        self.running: dict[str, Any] | None = None
        self.trials: list[Trial] = []
        self.best: tuple[float, dict[str, Any]] | None = None
        self._seen: dict[str, bool] = {}  # station key -> was it an improvement

    def run(self, point: dict[str, Any]) -> Eval:
        station = self.full(self.base | point)
        ev = self.measure(station, self.n)
        entries = charge(self.costs, self.running, station, ev.load_s, ev.cards)
        restarted = any(e.what == "restart" for e in entries)
        self.running = station
        improved = ev.feasible and (self.best is None or ev.objective > self.best[0])  # type: ignore[operator]
        if improved:
            self.best = (ev.objective, dict(point))  # type: ignore[assignment]
        key = repr(sorted((k, repr(v)) for k, v in point.items()))
        repeated = key in self._seen and not self._seen[key]
        self._seen[key] = self._seen.get(key, False) or improved
        hours = sum(e.card_hours for e in entries)
        cum = (self.trials[-1].cum_card_hours if self.trials else 0.0) + hours
        self.trials.append(Trial(index=len(self.trials) + 1, knobs=dict(point), n=self.n, verdict=ev.verdict,
                                 objective=ev.objective, feasible=ev.feasible, card_hours=hours, cum_card_hours=cum,
                                 restarted=restarted, incumbent=dict(self.best[1]) if self.best else None,
                                 improved=improved, repeated_negative=repeated))
        return ev

"""The goal's space searched on its twin (agent/planner/twin.py): every station predicted whole, feasibility from
every limit the goal names.

A station's prediction is the twin's Summary of it at the goal's confirm N (the comparison the objective is judged
by), with the goal's SLOs, so every objective and every latency limit at its own statistic is read off it
(core/goalview.py); a station is feasible when each limit's predicted figure is under its limit and the contract
(all succeed, output length, cards, cache hit) holds. Stations rank by the objective in the whole window (the
window every simulated station has), feasible first; an infeasible one by how little it breaks its worst limit; one
that breaks the contract last (a run of it would be invalid, never a result).

Where the space of the knobs the simulator models is small enough to simulate within one proposal
(STATIONS_PER_PROPOSAL, a count of stations: the proposal's time over one station's simulation), every station of it
is predicted and the best is the twin's optimum, exactly; otherwise the best station's one-change neighbours are
predicted and a coordinate ascent follows the best feasible neighbour, within the same count. Only stations the
knob catalog accepts are simulated (a dependency such as a draft width without a draft method is skipped). Gains
are relative to the twin's own prediction of the best station, so a bias the twin shares across stations cancels.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from agent.planner.accepted import accepted
from agent.planner.history import History
from core.canonical import canon
from core.goalview import GoalView
from core.summary import Summary

STATIONS_PER_PROPOSAL = 128  # stations simulated per proposal (~0.25 s each at N = 640 on one core, ~30 s in all):
# a space of the simulator's knobs up to this size is searched exhaustively, a larger one by the ascent; raise it
# as the simulator gets faster (bench/sim_speed.py)
OBJECTIVE_KEY = "objective (whole)"  # the figure the search ranks stations by and the twin's lead is judged on


def figures(view: GoalView, s: Summary | None) -> dict[str, float | None]:
    """Every figure of a run the goal uses: its objective in the whole window (what every station has), in the
    goal's own window when that is native, and each latency limit's figure at its own statistic."""
    out: dict[str, float | None] = {OBJECTIVE_KEY: view.objective(s, "whole")}
    if view.window == "native":
        out["objective (native)"] = view.objective(s, "native")
    for lim in view.limits:
        out[lim.figure_key] = lim.figure(s)
    return out


def prediction_of(history: History, twin: Any, knobs: dict[str, Any], n: int) -> dict[str, Any]:
    """The twin's prediction of one station at N = n, with the goal's SLOs and native-window rule."""
    goal, p = history.goal, history.goal.protocol
    return twin.predict(goal.scenario, knobs, n, p.warmup, p.seeds[0], slos=goal.view().slos() or None,
                        native=(p.native_min_requests, p.native_min_seconds))


@dataclass
class Station:
    knobs: dict[str, Any]
    objective: float | None  # the objective's figure in the whole window
    excess: float  # how far it breaks its worst latency limit, relative (0: keeps them all; inf: unpredicted)
    feasible: bool  # keeps every latency limit and the goal's contract
    broken: str = ""  # the contract the station breaks (a run of it would be invalid, never a result)
    figures: dict[str, float | None] = field(default_factory=dict)  # every figure the goal uses (twin.figures)

    def score(self) -> tuple[int, float]:
        """Feasible first, then the objective; an infeasible station by how little it breaks its worst limit, one
        that breaks the contract last (it can never be a result)."""
        if self.feasible:
            return (1, self.objective or 0.0)
        if self.broken:
            return (-1, 0.0)
        return (0, -self.excess)


@dataclass
class Search:
    base: Station  # the twin's prediction of the best station
    singles: list[tuple[str, Any, Station]]  # every one-change neighbour of the best station
    path: list[tuple[str, Any]]  # the changes to the optimum, in order (the ascent's; exhaustive: largest gain first)
    optimum: Station
    simulated: int
    unmodelled: tuple[str, ...] = field(default_factory=tuple)
    exhaustive: bool = False  # every station of the modelled space was predicted


def predicted(history: History, twin: Any, knobs: dict[str, Any]) -> tuple[Station, tuple[str, ...]]:
    """The twin's figures of one station at the goal's confirm N, and the knobs it does not model."""
    view = history.goal.view()
    got = prediction_of(history, twin, knobs, history.goal.protocol.confirm_n)
    s = got.get("summary")
    figs = figures(view, s)
    unpredicted = s is None or any(lim.figure(s) is None for lim in view.limits)
    broken = "; ".join(view.contract_breaks(s)) if s is not None else ""
    kept = not unpredicted and all(lim.kept(lim.figure(s)) for lim in view.limits)
    return (Station(dict(knobs), figs[OBJECTIVE_KEY], math.inf if unpredicted else view.excess(s),
                    not broken and kept, broken, figs),
            tuple(got.get("knobs_not_modelled") or ()))


def search(history: History, twin: Any, budget: int = STATIONS_PER_PROPOSAL) -> Search | None:
    """The twin's optimum over the goal's space: exhaustive where the modelled space fits `budget`, else the
    best station's one-change neighbourhood and its ascent."""
    goal = history.goal
    count = [0]

    def at(knobs: dict[str, Any]) -> tuple[Station, tuple[str, ...]]:
        count[0] += 1
        return predicted(history, twin, knobs)

    best = history.best_knobs
    base, left = at(best)
    if base.objective is None:
        return None
    space = {k: list(v) for k, v in goal.space().items() if v and k not in left}
    unmodelled = tuple(k for k in goal.space() if k in left)
    if math.prod(len(v) for v in space.values()) <= budget:
        return _exhaustive(history, base, space, at, count, unmodelled)

    def neighbours(knobs: dict[str, Any]) -> list[tuple[str, Any, Station]]:
        out = []
        for k, vs in space.items():
            for v in vs:
                if canon(v) != canon(knobs.get(k)) and count[0] < budget and accepted(knobs | {k: v}, goal.engine):
                    out.append((k, v, at(knobs | {k: v})[0]))
        return out

    singles = neighbours(best)
    cur, path = base, []
    steps = singles
    while steps:
        k, v, st = max(steps, key=lambda s: s[2].score())
        if st.score() <= cur.score() or st.objective is None:
            break
        cur = st
        path.append((k, v))
        steps = neighbours(cur.knobs)
    return Search(base=base, singles=singles, path=path, optimum=cur, simulated=count[0], unmodelled=unmodelled)


def _exhaustive(history: History, base: Station, space: dict[str, list[Any]], at: Any, count: list[int],
                unmodelled: tuple[str, ...]) -> Search:
    """Every station of the modelled space predicted; the optimum is the best of them (the best station itself on
    a tie), the path its changes from the best station, the largest single gain first."""
    best = history.best_knobs
    singles: list[tuple[str, Any, Station]] = []
    opt = base
    for combo in itertools.product(*space.values()):
        knobs = best | dict(zip(space, combo))
        changed = [k for k in space if canon(knobs[k]) != canon(best.get(k))]
        if not changed or not accepted(knobs, history.goal.engine):
            continue
        st = at(knobs)[0]
        if len(changed) == 1:
            singles.append((changed[0], knobs[changed[0]], st))
        if st.objective is not None and st.score() > opt.score():
            opt = st
    alone = {(k, canon(v)): gain(st, base) or 0.0 for k, v, st in singles}
    path = sorted(((k, opt.knobs[k]) for k in space if canon(opt.knobs[k]) != canon(best.get(k))),
                  key=lambda kv: -alone.get((kv[0], canon(kv[1])), 0.0))
    return Search(base=base, singles=singles, path=path, optimum=opt, simulated=count[0], unmodelled=unmodelled,
                  exhaustive=True)


def gain(st: Station, base: Station) -> float | None:
    if st.objective is None or not base.objective:
        return None
    return st.objective / base.objective - 1.0

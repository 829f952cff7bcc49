"""The goal's space searched on its twin (agent/planner/twin.py): every station predicted whole, feasibility from every
limit the goal names.

A station's prediction is the twin's Summary of it at the goal's confirm N (the comparison the objective is judged
by), with the goal's SLOs, so every objective and every latency limit at its own statistic is read off it
(core/goalview.py); a station is feasible when each limit's predicted figure is under its limit and the contract
(all succeed, output length, cards, cache hit) holds. Stations rank by the objective in the whole window (the window
every simulated station has), feasible first; an infeasible one by how little it breaks its worst limit; one that
breaks the contract last (a run of it would be invalid, never a result).

Where the space of the knobs the simulator models is small enough to simulate within one proposal
(STATIONS_PER_PROPOSAL, a count of stations: the proposal's time over one station's simulation), every station of it
is predicted and the best is the twin's optimum, exactly. A larger space is searched model-based within the same
count: the best station's one-change neighbours, then Optuna's TPE over the modelled knobs with the twin's objective
and each station's limit excess as its constraint (agent/planner/encoded.py: the explorer's encoding and study, seeded
from the goal and the best station, so the same inputs give the same proposal), then a coordinate ascent from the
study's best. A one-change ascent alone stops where no single change gains, however far the optimum (a rate that
needs a wider decode batch to keep its tail); the study moves several knobs at once (bench/twin_search.py). Only
stations the knob catalog accepts are simulated (a dependency such as a draft width without a draft method is
skipped, and the study is told it is out), each once per search. Gains are relative to the twin's own prediction of
the best station, so a bias the twin shares across stations cancels.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from agent.planner.accepted import accepted
from agent.planner.encoded import Space
from agent.planner.encoded import study as study_of
from agent.planner.history import History
from agent.planner.twin_fit import TwinFit
from core.canonical import canon, digest, dumps
from core.goalview import GoalView
from core.summary import Summary

STATIONS_PER_PROPOSAL = 128  # stations simulated per proposal (set at ~0.25 s each at N = 640 on one core, ~30 s in
# all; since issue 43's simulator work 30-75 ms each, 118 DeepSeek-V3 P8+D8 stations in 3.8 s): a space of the
# simulator's knobs up to this size is searched exhaustively, a larger one model-based; raise it as the simulator
# gets faster (bench/sim_speed.py), re-measuring the bench (every space between the old and new count changes search)
ASKS_PER_STATION = 4  # TPE suggestions per simulated station at most (a refused or already simulated one costs none)
REPEATS_TO_STOP = 24  # suggestions in a row that simulate nothing new: the study has settled, the polish takes over
UNPREDICTED = 1e6  # the constraint of a station the twin cannot predict or the catalog refuses (Optuna takes no inf)
SEED_HEX_DIGITS = 8  # hex digits of the goal's and best station's digest that seed the study (a 32-bit seed)
HEX = 16  # the digest's base
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


def prediction_of(history: History, twin: TwinFit, knobs: dict[str, Any], n: int) -> dict[str, Any]:
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


def predicted(history: History, twin: TwinFit, knobs: dict[str, Any]) -> tuple[Station, tuple[str, ...]]:
    """The twin's figures of one station at the goal's confirm N, and the knobs it does not model."""
    view = history.goal.view()
    got = prediction_of(history, twin, knobs, history.goal.protocol.confirm_n)
    s = got.get("summary")
    figs = figures(view, s)
    unpredicted = s is None or any(lim.figure(s) is None for lim in view.limits)
    broken = "; ".join(v.words for v in view.terms.contract_breaks(s)) if s is not None else ""
    kept = not unpredicted and all(lim.kept(lim.figure(s)) for lim in view.limits)
    return (Station(dict(knobs), figs[OBJECTIVE_KEY], math.inf if unpredicted else view.excess(s),
                    not broken and kept, broken, figs),
            tuple(got.get("knobs_not_modelled") or ()))


def runnable(history: History, knobs: dict[str, Any]) -> bool:
    """A station the search may consider: the catalog accepts it (agent/planner/accepted.py) and it makes no failed
    accuracy evaluation's quality-risk settings (never deployable, whatever its speed)."""
    return accepted(knobs, history.goal.engine) and history.quality_failed(knobs) is None


def search(history: History, twin: TwinFit, budget: int = STATIONS_PER_PROPOSAL) -> Search | None:
    """The twin's optimum over the goal's space: exhaustive where the modelled space fits `budget`, else model-based
    (the best station's one-change neighbourhood, a seeded TPE study on the twin, a coordinate polish)."""
    goal = history.goal
    seen: dict[str, tuple[Station, tuple[str, ...]]] = {}

    def at(knobs: dict[str, Any]) -> tuple[Station, tuple[str, ...]]:
        key = dumps(knobs)
        if key not in seen:  # a station is simulated once per search, however often it is reached
            seen[key] = predicted(history, twin, knobs)
        return seen[key]

    best = history.best_knobs
    base, left = at(best)
    if base.objective is None:
        return None
    space = {k: list(v) for k, v in goal.space().items() if v and k not in left}
    unmodelled = tuple(k for k in goal.space() if k in left)
    if math.prod(len(v) for v in space.values()) <= budget:
        return _exhaustive(history, base, space, at, seen, unmodelled)
    return model_based(history, base, space, at, seen, budget, unmodelled)


def model_based(history: History, base: Station, space: dict[str, list[Any]], at: Any, seen: dict[str, Any],
                budget: int, unmodelled: tuple[str, ...]) -> Search:
    """The best station's one-change neighbours first (so the result is never worse than the ascent from it), then a
    TPE study over the modelled knobs with the twin's objective and each station's limit excess as its constraint
    (seeded from the goal and the best station: the same inputs give the same proposal), then a coordinate ascent
    from the study's best with one neighbourhood of the count kept for it. Refused stations cost no simulation."""
    goal, best = history.goal, history.best_knobs
    singles = _neighbours(history, space, best, at, seen, budget)
    enc = Space(space)
    told = [(enc.encode(st.knobs), st) for st in [base] + [st for _, _, st in singles]]
    study = study_of(enc, [(idx, st.objective or 0.0, _violation(st)) for idx, st in told if idx is not None],
                   int(digest([goal.model_dump(mode="json"), best], SEED_HEX_DIGITS), HEX))
    dists = enc.distributions()
    polish = sum(len(v) - 1 for v in space.values())  # one neighbourhood of the study's best left for the ascent
    asks = repeats = 0
    while len(seen) < budget - polish and asks < ASKS_PER_STATION * budget and repeats < REPEATS_TO_STOP:
        asks += 1
        trial = study.ask(fixed_distributions=dists)
        knobs = best | {k: enc.values[k][i] for k, i in trial.params.items()}
        new = dumps(knobs) not in seen
        st = at(knobs)[0] if runnable(history, knobs) else None
        repeats = repeats + 1 if st is None or not new else 0
        trial.set_constraint("latency_excess", UNPREDICTED if st is None else _violation(st))
        study.tell(trial, 0.0 if st is None else st.objective or 0.0)
    cur = max((st for st, _ in seen.values() if st.objective is not None), key=Station.score, default=base)
    cur = base if cur.score() <= base.score() else cur  # the best station itself on a tie
    while True:  # the polish: the best one change from the optimum so far, while it gains
        steps = _neighbours(history, space, cur.knobs, at, seen, budget)
        top = max((st for _, _, st in steps), key=Station.score, default=None)
        if top is None or top.objective is None or top.score() <= cur.score():
            break
        cur = top
    return Search(base=base, singles=singles, path=path_to(best, cur, space, singles, base), optimum=cur,
                  simulated=len(seen), unmodelled=unmodelled)


def _neighbours(history: History, space: dict[str, list[Any]], knobs: dict[str, Any], at: Any,
                seen: dict[str, Any], budget: int) -> list[tuple[str, Any, Station]]:
    """Every one-change neighbour of a station that could run, while the count allows a new simulation."""
    out = []
    for k, vs in space.items():
        for v in vs:
            nb = knobs | {k: v}
            if canon(v) != canon(knobs.get(k)) and (dumps(nb) in seen or len(seen) < budget) and runnable(history, nb):
                out.append((k, v, at(nb)[0]))
    return out


def _violation(st: Station) -> float:
    """A station's constraint for the study: how far it breaks its worst limit; a broken contract at least 1."""
    if math.isinf(st.excess):
        return UNPREDICTED
    return max(st.excess, 1.0) if st.broken else st.excess


def _exhaustive(history: History, base: Station, space: dict[str, list[Any]], at: Any, seen: dict[str, Any],
                unmodelled: tuple[str, ...]) -> Search:
    """Every station of the modelled space predicted; the optimum is the best of them (the best station itself on
    a tie), the path its changes from the best station, the largest single gain first."""
    best = history.best_knobs
    singles: list[tuple[str, Any, Station]] = []
    opt = base
    for combo in itertools.product(*space.values()):
        knobs = best | dict(zip(space, combo))
        changed = [k for k in space if canon(knobs[k]) != canon(best.get(k))]
        if not changed or not runnable(history, knobs):
            continue
        st = at(knobs)[0]
        if len(changed) == 1:
            singles.append((changed[0], knobs[changed[0]], st))
        if st.objective is not None and st.score() > opt.score():
            opt = st
    return Search(base=base, singles=singles, path=path_to(best, opt, space, singles, base), optimum=opt,
                  simulated=len(seen), unmodelled=unmodelled, exhaustive=True)


def path_to(best: dict[str, Any], opt: Station, space: dict[str, list[Any]],
            singles: list[tuple[str, Any, Station]], base: Station) -> list[tuple[str, Any]]:
    """The changes from the best station to the optimum, the largest single gain first (the pair and the jump
    name the first ones)."""
    alone = {(k, canon(v)): gain(st, base) or 0.0 for k, v, st in singles}
    return sorted(((k, opt.knobs[k]) for k in space if canon(opt.knobs.get(k)) != canon(best.get(k))),
                  key=lambda kv: -alone.get((kv[0], canon(kv[1])), 0.0))


def gain(st: Station, base: Station) -> float | None:
    if st.objective is None or not base.objective:
        return None
    return st.objective / base.objective - 1.0

"""The goal's deployment twin, as the planner reads it: how well it predicts this goal's runs, and what a search of
the goal's space on it says.

The twin is a simulator profile calibrated to the goal's own valid runs from a prior of the same structure
(executor/twin.py fits it; the loop hands the planner a fitter, `History.twin`, so the planner never imports the
simulator). Its fidelity is measured, never assumed: every valid run is predicted by the twin
fitted on the runs before it (out of sample), and the relative error of the objective (whole window) is scored
against the interval the twin had then. The interval is the measured error's spread (INTERVAL_Z × its RMS,
floored at the run-to-run noise, CLEAR_LOSS), never wider than the drift threshold, the error at which a
calibrated simulator is called off (core.ledger.DRIFT_THRESHOLD): a twin that errs more than that misses however
steadily it errs (an interval made of its own errors would always hold them). The goal's first run is predicted
by the prior itself (the fit on no run), and that error sets the interval only until a fitted twin's prediction
was scored (it measured the prior, not the twin calibrated since); before any run was predicted the interval is the
drift threshold.

The twin leads while it predicts this goal's runs inside its interval. A miss refits it (the missed run joins the
fit); MISSES_TO_YIELD misses in a row, or a fit that fails, hand the lead to the evidence rules and the explorer,
and the cards say so. A knob of the space the simulator does not model is never searched on the twin.

The search: from the best station, every one-change neighbour in the goal's space is simulated at the confirm N
(the comparison the objective is judged by), then a coordinate ascent follows the best feasible neighbour (the
TPOT limit as a constraint) to the twin's optimum, within SEARCH_SIMULATIONS stations. Gains are relative to the
twin's own prediction of the best station, so a bias the twin shares across stations cancels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from agent.planner.accepted import accepted
from agent.planner.history import History, Outcome
from agent.planner.judgement import CLEAR_LOSS
from core.canonical import canon
from core.ledger import DRIFT_THRESHOLD

INTERVAL_Z = 1.64  # the twin's interval: ± 1.64 × the RMS of its measured errors (90 % of a normal error)
MISSES_TO_YIELD = 2  # misses in a row before the twin hands the lead over (one miss refits it with the run it missed)
SEARCH_SIMULATIONS = 96  # stations simulated per search (~0.3 s each at N = 640 on one core): the one-change
# neighbourhood of the bench's widest space is 16 stations, so an ascent of five steps fits
ERRORS_SHOWN = 3  # a card shows the twin's errors on the goal's last three runs (the rest are in the ledger)
PRIOR_INTERVAL = DRIFT_THRESHOLD  # before any run was predicted: the error at which a calibrated simulator is off


class TwinFit(Protocol):
    """One fit of the twin (executor.twin.Twin)."""

    runs: tuple[str, ...]

    def predict(self, scenario: str, knobs: dict[str, Any], n: int, warmup: int = 0,
                seed: int = 0) -> dict[str, Any]: ...

    def coefficients(self) -> dict[str, tuple[float, float | None, str]]: ...


Fitter = Callable[[tuple[str, ...]], "TwinFit | str"]  # run ids -> the twin fitted on them, or why not


@dataclass(frozen=True)
class Scored:
    run_id: str
    predicted: float
    measured: float
    interval: float  # the twin's relative half-width when it predicted this run
    prior: bool = False  # predicted by the prior itself (the fit on no run)

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0

    @property
    def miss(self) -> bool:
        return abs(self.error) > self.interval


@dataclass(frozen=True)
class Fidelity:
    twin: TwinFit | None  # the twin fitted on every valid run (None: no fit)
    scored: tuple[Scored, ...]
    interval: float  # the twin's relative half-width now
    leads: bool
    why: str

    def words(self) -> str:
        if not self.scored:
            return f"no run predicted yet (interval ±{self.interval:.0%}, the drift threshold)"
        errs = ", ".join(f"{s.error:+.1%}{' (miss)' if s.miss else ''}" for s in self.scored[-ERRORS_SHOWN:])
        return f"out-of-sample errors of its last runs {errs}; interval now ±{self.interval:.1%}"


def metric_of(goal: Any) -> str:
    """The figure the twin predicts for the goal's objective (whole window)."""
    return "output_tok_s_per_card" if goal.objective.metric.endswith("per_card") else "output_tok_s"


def runs_of(history: History) -> list[Outcome]:
    """The goal's valid runs in its scenario, in order, one per run id."""
    out, seen = [], set()
    for o in history.outcomes:
        if o.verdict == "valid" and o.summary is not None and o.summary.whole is not None and o.run_id \
                and o.card.scenario == history.goal.scenario and o.run_id not in seen:
            seen.add(o.run_id)
            out.append(o)
    return out


def _interval(scored: list[Scored]) -> float:
    """The interval from the fitted twin's errors; the prior's own error (the first run) only until a fit was
    scored: it measured the prior, not the twin calibrated since."""
    errors = [s.error for s in scored if not s.prior] or [s.error for s in scored]
    if not errors:
        return PRIOR_INTERVAL
    rms = math.sqrt(sum(e * e for e in errors) / len(errors))
    return min(PRIOR_INTERVAL, max(CLEAR_LOSS, INTERVAL_Z * rms))


def fidelity(history: History, fitter: Fitter) -> Fidelity:
    """The twin fitted on the goal's valid runs, and how well each prefix predicted the next run."""
    goal, metric = history.goal, metric_of(history.goal)
    runs = runs_of(history)
    if not runs:
        return Fidelity(None, (), PRIOR_INTERVAL, False, "no valid run to fit the twin to")
    scored: list[Scored] = []
    for k in range(len(runs)):  # the first run predicted by the prior itself (the fit on no run)
        fit = fitter(tuple(o.run_id for o in runs[:k]))  # type: ignore[misc]
        if isinstance(fit, str):
            continue
        o = runs[k]
        y = getattr(o.summary.whole, metric, None)  # type: ignore[union-attr]
        p = fit.predict(goal.scenario, o.card.knobs, o.card.n, goal.protocol.warmup, goal.protocol.seeds[0]).get(metric)
        if y and p:
            scored.append(Scored(o.run_id or "", float(p), float(y), _interval(scored), prior=k == 0))
    fit = fitter(tuple(o.run_id for o in runs))  # type: ignore[misc]
    interval = _interval(scored)
    if isinstance(fit, str):
        return Fidelity(None, tuple(scored), interval, False, f"the twin cannot be fitted: {fit}")
    tail = scored[-MISSES_TO_YIELD:]
    if len(tail) == MISSES_TO_YIELD and all(s.miss for s in tail):
        return Fidelity(fit, tuple(scored), interval, False,
                        f"the twin missed its last {MISSES_TO_YIELD} runs outside its interval "
                        f"({', '.join(f'{s.error:+.1%} vs ±{s.interval:.1%}' for s in tail)}): re-calibrating did "
                        f"not bring it back, so the evidence rules and the explorer lead")
    return Fidelity(fit, tuple(scored), interval, True, "")


@dataclass
class Station:
    knobs: dict[str, Any]
    objective: float | None
    tpot: float | None
    feasible: bool  # keeps the TPOT limit and the goal's contract (the cards it requires)
    broken: str = ""  # the contract the station breaks (a run of it would be invalid, never a result)

    def score(self) -> tuple[int, float]:
        """Feasible first, then the objective; an infeasible station by how little it breaks the limit, one that
        breaks the contract last (it can never be a result)."""
        if self.feasible:
            return (1, self.objective or 0.0)
        if self.broken:
            return (-1, 0.0)
        return (0, -(self.tpot or math.inf))


@dataclass
class Search:
    base: Station  # the twin's prediction of the best station
    singles: list[tuple[str, Any, Station]]  # every one-change neighbour of the best station
    path: list[tuple[str, Any]]  # the ascent's changes, in order
    optimum: Station
    simulated: int
    unmodelled: tuple[str, ...] = field(default_factory=tuple)


def predicted(history: History, twin: TwinFit, knobs: dict[str, Any]) -> tuple[Station, tuple[str, ...]]:
    """The twin's figures of one station at the goal's confirm N, and the knobs it does not model."""
    goal = history.goal
    limit = goal.constraints.tpot_mean_ms_lt
    got = twin.predict(goal.scenario, knobs, goal.protocol.confirm_n, goal.protocol.warmup, goal.protocol.seeds[0])
    tpot = got.get("tpot_mean_ms")
    need, cards = goal.constraints.cards, got.get("cards")
    broken = f"uses {cards} card(s), the goal requires {need}" if need and cards is not None and cards < need else ""
    return (Station(dict(knobs), got.get(metric_of(goal)), tpot,
                    not broken and (limit is None or (tpot is not None and tpot < limit)), broken),
            tuple(got.get("knobs_not_modelled") or ()))


def search(history: History, twin: TwinFit, budget: int = SEARCH_SIMULATIONS) -> Search | None:
    """The twin's one-change neighbourhood of the best station and its ascent to the twin's optimum."""
    goal = history.goal
    count = [0]

    def at(knobs: dict[str, Any]) -> tuple[Station, tuple[str, ...]]:
        count[0] += 1
        return predicted(history, twin, knobs)

    base, left = at(history.best_knobs)
    if base.objective is None:
        return None
    space = {k: list(v) for k, v in goal.space().items() if v and k not in left}

    def neighbours(knobs: dict[str, Any]) -> list[tuple[str, Any, Station]]:
        out = []
        for k, vs in space.items():
            for v in vs:
                if canon(v) != canon(knobs.get(k)) and count[0] < budget and accepted(knobs | {k: v}, goal.engine):
                    out.append((k, v, at(knobs | {k: v})[0]))  # a station the catalog refuses can never run
        return out

    singles = neighbours(history.best_knobs)
    cur, path = base, []
    steps = singles
    while steps:
        k, v, st = max(steps, key=lambda s: s[2].score())
        if st.score() <= cur.score() or st.objective is None:
            break
        cur = st
        path.append((k, v))
        steps = neighbours(cur.knobs)
    return Search(base=base, singles=singles, path=path, optimum=cur, simulated=count[0],
                  unmodelled=tuple(k for k in goal.space() if k in left))


def gain(st: Station, base: Station) -> float | None:
    if st.objective is None or not base.objective:
        return None
    return st.objective / base.objective - 1.0

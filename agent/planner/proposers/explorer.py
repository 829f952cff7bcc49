"""Exploration when the evidence rules run out: Optuna's TPE over the goal's space proposes the next card.

The study is warm-started from every valid run of the goal (`add_trial` of the measured stations, how far each breaks
its worst latency limit as an Optuna constraint, so TPE's "good" set holds only stations that meet them all). Its suggestions are projected
onto the best station's one-change neighbourhood, so the card stays an experiment card: one change, the same
checks, never a known negative or a veto, ordered by what it is expected to win per card-hour. Only when every
one-change neighbour is measured or ruled out does a suggestion keep its two largest changes (a coupled pair,
mechanism "exploration: … (pair)"), where the model expects it to improve on the best. The expected
effect comes from a kernel model of the measured objective (a Nadaraya-Watson estimate over the same encoded
space, with an uncertainty that grows with the distance to the nearest measurement): a predicted change with an
interval, and the expected improvement over the best (Gaussian EI) that the stop rule reads. Deterministic: the
sampler is seeded from the goal's first seed and the number of runs it was told.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import optuna

from agent.planner.best import best_infeasible
from agent.planner.candidates import CandidateCard, build_card
from agent.planner.cards import CARD_HOURS_DIGITS
from agent.planner.checks import check, estimate, retry_note
from agent.planner.encoded import Space
from agent.planner.encoded import study as study_of
from agent.planner.history import History
from agent.planner.pairs import build_pair
from agent.planner.proposers.base import Asking, Exploring, Proposals, Proposed, Proposer
from agent.planner.screens import load_unchanged, screen_blind, to_confirm
from agent.planner.tpot_fit import normal_cdf
from agent.planner.value import INTERVAL_Z, PREDICTED_DIGITS, VALUE_DIGITS, Value, per_card_hour
from core.goalview import effect
from core.ledger import Interval
from core.ledger import Prediction as LedgerPrediction

BANDWIDTH = 0.25  # kernel width in the encoded space (each ordered knob spans 0..1; another enum choice is 1)
DEFAULT_EFFECT = 0.1  # the relative effect of one change before two stations one change apart were measured
ASKS = 24  # TPE suggestions drawn per planning step (each projected onto the one-change neighbourhood)
WEIGHT_FLOOR = 1e-12  # added to every kernel weight: far from every measurement the weights still sum above 0
SEED_STRIDE = 7919  # a prime (the 1000th): the sampler's seed is the goal's first seed × it + the runs it was told
optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True)
class Prediction:
    mean: float  # predicted objective
    sigma: float
    base: float  # the best station's measured objective
    ei: float  # expected improvement over `base` (objective units)
    violation: float  # predicted latency violation (0 = meets every limit)

    @property
    def ei_pct(self) -> float:
        return 100.0 * self.ei / self.base if self.base > 0 else 0.0

    def ledger(self, metric: str, window: str) -> LedgerPrediction:
        """The hypothesis ledger's form: the relative effect on the objective with the 90 % interval."""
        b = self.base if self.base > 0 else 1.0
        lo, hi = self.mean - INTERVAL_Z * self.sigma, self.mean + INTERVAL_Z * self.sigma
        return LedgerPrediction(source="explorer", objective=f"{metric} ({window})",
                                objective_effect=Interval(value=self.mean / b - 1, lo=lo / b - 1, hi=hi / b - 1),
                                basis=f"the explorer's model over the goal's valid runs (expected improvement "
                                      f"{self.ei_pct:.2f} %)", predicted={metric: round(self.mean, PREDICTED_DIGITS)})

    def text(self, metric: str) -> str:
        rel = (lambda x: effect(x / self.base - 1, tight=True)) if self.base > 0 else (lambda x: f"{x:.1f}")  # noqa: E731
        lo, hi = self.mean - INTERVAL_Z * self.sigma, self.mean + INTERVAL_Z * self.sigma
        return (f"predicted {metric} {self.mean:.1f} ({rel(self.mean)}, 90 % interval {rel(lo)} .. {rel(hi)}); "
                f"expected improvement {self.ei_pct:.2f} %" + (f"; predicted over a latency limit by "
                                                                f"{self.violation:.0%}" if self.violation > 0 else ""))


def observations(history: History, space: Space) -> list[tuple[dict[str, int], float, float]]:
    """Every valid run of the goal as (encoded station, objective, latency violation: how far it breaks its worst
    latency limit, relative, core/goalview.py), one per station (mean)."""
    goal = history.goal
    view = goal.view()
    acc: dict[str, tuple[dict[str, int], list[float], float]] = {}
    for o in history.outcomes:
        if o.verdict != "valid" or o.summary is None:
            continue
        y = goal.objective.value(o.summary)
        if y is None and o.summary.whole is not None:  # the objective's window missing: the whole window stands in
            y = getattr(o.summary.whole, goal.objective.metric, None)
        idx = space.encode(o.card.knobs)
        if y is None or idx is None:
            continue
        viol = view.excess(o.summary)
        if o.figures is not None and o.figures.slo_violations and viol == 0.0:
            viol = 1.0  # another constraint broken (all requests must succeed, ...)
        key = repr(sorted(idx.items()))
        prev = acc.get(key)
        acc[key] = (idx, (prev[1] if prev else []) + [float(y)], max(viol, prev[2] if prev else 0.0))
    return [(idx, sum(ys) / len(ys), v) for idx, ys, v in acc.values()]


class Model:
    """The kernel model of the measured objective and latency violation over the encoded space."""

    def __init__(self, space: Space, obs: list[tuple[dict[str, int], float, float]]):
        self.space = space
        self.x = np.array([space.vector(i) for i, _, _ in obs])
        self.y = np.array([y for _, y, _ in obs])
        self.v = np.array([v for _, _, v in obs])
        feasible = self.y[self.v <= 0]
        self.base = float(feasible.max()) if len(feasible) else 0.0
        # the scale of one change's effect here: the RMS relative difference of measured stations one change apart
        effects = [abs(yi / yj - 1.0) for (a, yi, _), (b, yj, _) in itertools.combinations(obs, 2)
                   if yj > 0 and sum(a[k] != b[k] for k in a) == 1]
        self.effect = math.sqrt(sum(e * e for e in effects) / len(effects)) if effects else DEFAULT_EFFECT
        self.spread = self.effect * (self.base or float(np.abs(self.y).max()))

    def predict(self, idx: dict[str, int]) -> Prediction:
        d = self.space.distance(self.x, self.space.vector(idx))
        w = np.exp(-(d ** 2) / (2 * BANDWIDTH ** 2)) + WEIGHT_FLOOR
        mu = float((w * self.y).sum() / w.sum())
        var = float((w * (self.y - mu) ** 2).sum() / w.sum())
        sigma = math.sqrt(var + (self.spread * min(1.0, float(d.min()) / BANDWIDTH)) ** 2)
        viol = float((w * self.v).sum() / w.sum())
        if sigma <= 0:
            ei = max(0.0, mu - self.base)
        else:
            z = (mu - self.base) / sigma
            ei = (mu - self.base) * normal_cdf(z) + sigma * math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
        return Prediction(mean=mu, sigma=sigma, base=self.base, ei=max(0.0, ei), violation=viol)


@dataclass(frozen=True)
class Proposal:
    card: CandidateCard
    value: Value
    prediction: Prediction


def propose(history: History, why_rules: str,
            restage: Callable[[CandidateCard], CandidateCard] | None = None) -> tuple[list[Proposal], int]:
    """The explorer's cards that pass the checks, best first (expected improvement per card-hour; while the best
    breaks the SLO, the smallest predicted violation first), and how many valid runs the study was told."""
    goal = history.goal
    space = Space(goal.space())
    if not space.values:
        return [], 0
    obs = observations(history, space)
    best_idx = space.encode(history.best_knobs)
    if not obs or best_idx is None:
        return [], len(obs)
    model = Model(space, obs)
    study = study_of(space, obs, int(goal.protocol.seeds[0]) * SEED_STRIDE + len(obs))
    seen: dict[str, Proposal | None] = {}
    restart = history.cost.estimate("restart", goal.protocol.screen_n, goal.protocol.warmup, needs_restart=True)
    infeasible = best_infeasible(history)
    dists = space.distributions()
    asked = []
    for _ in range(ASKS):
        t = study.ask(fixed_distributions=dists)
        asked.append(t.params)
        for k, i in t.params.items():
            if i == best_idx[k]:
                continue
            key = f"{k}={i}"
            if key in seen:
                continue
            seen[key] = _card(history, space, model, [(k, i)], restart, len(obs), why_rules, restage)
    props = [p for p in seen.values() if p is not None]
    if not props and _neighbourhood_spent(history, space, model, best_idx, restart, len(obs), why_rules, restage):
        # no one-change neighbour is left: the model is asked about the pairs TPE suggests
        props = _pairs(history, space, model, best_idx, asked, restart, len(obs), why_rules, restage)
    if infeasible:
        props.sort(key=lambda p: (p.prediction.violation, -p.value.value, p.card.title()))
    else:
        props.sort(key=lambda p: (-p.value.value, p.card.title()))
    return props, len(obs)


def _neighbourhood_spent(history: History, space: Space, model: Model, best_idx: dict[str, int], restart: float,
                         told: int, why_rules: str, restage: Callable[[CandidateCard], CandidateCard] | None) -> bool:
    """Every one-change neighbour of the best station (any other value of one knob) is measured or ruled out."""
    return all(_card(history, space, model, [(k, i)], restart, told, why_rules, restage) is None
               for k, vs in space.values.items() for i in range(len(vs)) if i != best_idx[k])


def _pairs(history: History, space: Space, model: Model, best_idx: dict[str, int], asked: list[dict[str, int]],
           restart: float, told: int, why_rules: str,
           restage: Callable[[CandidateCard], CandidateCard] | None) -> list[Proposal]:
    """Each TPE suggestion reduced to its two largest changes from the best station (a coupled pair), kept where
    the model expects it to improve on the best."""
    best = space.vector(best_idx)
    seen: dict[str, Proposal | None] = {}
    for params in asked:
        delta = space.vector(dict(params)) - best
        moved = [(abs(d), k) for d, (k, i) in zip(delta, params.items()) if i != best_idx[k]]
        if len(moved) < 2:
            continue
        moves = sorted((k, params[k]) for _, k in sorted(moved, key=lambda m: (-m[0], m[1]))[:2])
        key = repr(moves)
        if key not in seen:
            seen[key] = _card(history, space, model, moves, restart, told, why_rules, restage)
    return [p for p in seen.values() if p is not None and p.prediction.ei > 0]


def _card(history: History, space: Space, model: Model, moves: list[tuple[str, int]], restart: float, told: int,
          why_rules: str, restage: Callable[[CandidateCard], CandidateCard] | None) -> Proposal | None:
    goal = history.goal
    named = [(k, space.values[k][i]) for k, i in moves]
    idx = dict(space.encode(history.best_knobs) or {}) | dict(moves)
    pred = model.predict(idx)
    what = " with ".join(f"{k}={v!r}" for k, v in named)
    fields = dict(stage="screen", n=goal.protocol.screen_n, hypothesis="exploration",
                  mechanism=(f"exploration: Optuna TPE over the {told} valid run(s) of this goal (latency limits "
                             f"as its constraint) favours {what} ({why_rules})" + (" (pair)" if len(moves) > 1 else "")),
                  decision="whether the region the model favours beats the best station",
                  expected_effect=pred.text(goal.objective.metric),
                  negative_rules_out=f"{what} from this station: the model is told the result")
    try:
        if len(named) == 1:
            card = build_card(history.goal_id, goal.scenario, history.best_knobs, named[0][0], named[0][1], **fields)
        else:
            card = build_pair(history, named[0], named[1], **fields, coupling=(
                "exploration: every one-change neighbour of the best station is measured or ruled out; the model "
                f"expects {pred.ei_pct:.2f} % from moving {named[0][0]} and {named[1][0]} together"))
    except Exception:  # a knob outside the catalog cannot become a card
        return None
    if check(card, history) or load_unchanged(card, goal.protocol.confirm_n):  # the screen's checks (a known
        return None  # negative, a veto, ...) hold for its re-staging too; a change no N can see is no experiment
    blind = screen_blind(card, history, pred.ei / pred.base if pred.base > 0 else None) if restage is None else None
    if restage is not None or blind is not None:
        card = restage(card) if restage is not None else to_confirm(card, history, blind or "")
        if check(card, history):
            return None
    cost = estimate(card, history)
    gain = pred.ei / pred.base if pred.base > 0 else 0.0
    v = per_card_hour(gain, card.cost_class, cost, history.budget_left_card_hours, restart)
    value = Value(value=round(v, VALUE_DIGITS), gain=gain, confidence=1.0, rules_out=0.0, cost_card_hours=cost,
                  why=f"exploration: expected improvement {pred.ei_pct:.2f} %; {card.cost_class}, ~{cost:.2f} card-h")
    card = card.model_copy(update={"score": value.value, "est_card_hours": round(cost, CARD_HOURS_DIGITS),
                                   "note": retry_note(card, history) or card.note,
                                   "prediction": pred.ledger(goal.objective.metric, goal.objective.window)})
    return Proposal(card=card, value=value, prediction=pred)


class Explorer(Proposer):
    """The explore-phase proposer: when the rules run out, this model of the deployment's own runs proposes."""

    name = "explorer"
    phase = "explore"

    def propose(self, asking: Asking) -> Proposals:
        """Asked outside the explore phase (no reason the rules ran out, no re-staging): the model's proposals."""
        return self.explore(asking, Exploring(why_rules=""))

    def explore(self, asking: Asking, exploring: Exploring) -> Proposals:
        props, told = propose(asking.history, exploring.why_rules, exploring.restage)
        return Proposals(moves=[Proposed(p.card, p.value, p.prediction) for p in props], told=told)

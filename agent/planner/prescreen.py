"""Offline pre-screening: when the goal's target has a calibrated profile, each screen the planner proposes is
first simulated (its station and its parent's, same scenario, N and seed) before any device time is spent.

A screen the simulator predicts negative (less than the goal's least gain with no latency win, or a break of any
of the goal's latency limits at its own statistic, read off the simulated run's whole Summary) is set aside unrun:
returned with the plan (`Plan.set_aside`), which the loop records as a note "predicted negative" with the
prediction, its card cancelled (agent/loop/record.py record_set_asides), and never a negative (no negative memory, no ruled-out hypothesis, no KPI). A person runs it anyway with the usual
instruction, e.g. `tuneloop instruct G one_more_round --knob KNOB=VALUE` (REST and chat alike): an instructed card
is never pre-screened. A screen that passes carries the simulator's numeric prediction (the hypothesis ledger's
source "simulator") in place of the value model's.

Passing moves are also re-ranked: the planner is asked again with each passing move held back (up to RANK of
them), and the one with the highest simulated value per card-hour (predicted relative gain of the objective over
the card's estimated card-hours) runs first; its card's note says so, with the figures of every move compared,
and the planner's own order is kept on a tie. Moves held back are not recorded: the planner proposes them again
later. An LLM planner's card is not re-ranked (each ask would be a model call).
"""
from __future__ import annotations

from typing import Any

from agent.planner.candidates import CandidateCard
from agent.planner.checks import estimate
from agent.planner.history import History
from agent.planner.plan import PlanRow
from agent.planner.judgement import CLEAR_LOSS, LATENCY_WIN
from agent.planner.plan import Plan, Planner, SetAside
from agent.planner.value import PREDICTED_DIGITS
from core.executor_port import StationSimulator
from core.goalview import effect
from core.ledger import DRIFT_THRESHOLD, Interval, Prediction, relative


def screened(card: CandidateCard, history: History) -> bool:
    """Whether this change was already measured at the screen N (its confirm follows a screen)."""
    return any(o.card.stage == "screen" and o.card.knobs_hash == card.knobs_hash for o in history.outcomes)

MAX_SKIPS = 32  # screens set aside in one planning step before the planner's own answer is taken
RANK = 4  # passing moves compared by their simulated value per card-hour in one planning step
ORDINALS = {2: "second", 3: "third", 4: "fourth"}  # the words for a move's place up to RANK (4); past it "5th"
RANKED = "ranked first of"
HELD = "held back while the pre-screen ranks the moves by simulated value per card-hour"


class Prescreened:
    """A planner wrapper: asks the planner, simulates its move, and asks again while the move is predicted
    negative (each one set aside on the plan, for the loop to record) or, once one passes, to rank up to RANK
    passing moves."""

    def __init__(self, inner: Planner, simulator: StationSimulator):
        self.inner, self.simulator = inner, simulator
        self.name = inner.name
        self._cache: dict[str, dict[str, Any]] = {}

    def ask(self, history: History) -> Plan:
        aside: list[SetAside] = []
        notes: list[str] = []
        plan = self._ask(history, aside, notes)
        return plan.model_copy(update={"set_aside": tuple(aside), "notes": plan.notes + tuple(notes)}) \
            if aside or notes else plan

    def _ask(self, history: History, aside: list[SetAside], notes: list[str]) -> Plan:
        passing: list[tuple[float, float, Plan, Prediction]] = []  # (value per card-h, card-h, plan, prediction)
        probe = history  # the history the planner is asked with: set-asides and moves held back for the ranking
        for _ in range(MAX_SKIPS):
            plan = self.inner.ask(probe)
            card = plan.card
            if card is None or card.change is None or card.stage not in ("screen", "confirm") \
                    or card.planner == "instruction" or (card.stage == "confirm" and screened(card, probe)):
                break  # a confirm of a measured screen: the screen, not the simulator, predicts it
            pred, why = self.simulate(card, probe, notes)
            if pred is None:
                break
            if why is None:
                cost = estimate(card, probe)
                passing.append((pred.objective_effect.value / max(cost, 1e-6), cost, plan, pred))
                if not plan.move or card.planner == "llm" or len(passing) >= RANK:
                    break
                probe = probe.model_copy(update={"predicted_negatives": probe.predicted_negatives
                                                 | {card.station_key: HELD}})
                continue
            if not passing:  # the planner's own proposal: set aside and recorded (a later one is proposed again)
                aside.append(SetAside(card=card, prediction=pred, why=why))
                history = history.model_copy(update={"predicted_negatives": history.predicted_negatives
                                                     | {card.station_key: why}})
            probe = probe.model_copy(update={"predicted_negatives": probe.predicted_negatives | {card.station_key: why}})
        else:
            if not passing:
                return self.inner.ask(history)
        if not passing:
            return plan
        return self.ranked(passing)

    def ranked(self, passing: list[tuple[float, float, Plan, Prediction]]) -> Plan:
        """The passing move with the highest simulated value per card-hour (the planner's first on a tie)."""
        best = max(range(len(passing)), key=lambda i: (passing[i][0], -i))
        _, _, plan, pred = passing[best]
        card = plan.card.model_copy(update={"prediction": pred})
        if len(passing) == 1:
            return plan.model_copy(update={"card": card})
        figures = " | ".join(f"{p.card.title()}: {effect(pr.objective_effect.value, tight=True)} over {cost:.2f} card-h"
                            for _, cost, p, pr in passing)
        order = "the planner's first" if best == 0 else f"the planner's {_nth(best + 1)} (its first: {passing[0][2].card.title()})"
        why = (f"{RANKED} {len(passing)} passing moves by simulated value per card-hour (the calibrated "
               f"simulator), {order} — {figures}")
        pred = pred.model_copy(update={"basis": f"{pred.basis}; {RANKED} {len(passing)} passing moves by simulated "
                                                f"value per card-hour"})
        card = card.model_copy(update={"prescreen": why, "prediction": pred})
        first = passing[0][2]
        ranked = list(first.ranked) + [PlanRow.of(p.card.title(), v, f"simulated {effect(pr.objective_effect.value, tight=True)} over "
                                                  f"{cost:.2f} card-h") for v, cost, p, pr in passing]
        return plan.model_copy(update={"card": card, "ranked": ranked, "diagnosis": first.diagnosis})

    def _predict(self, history: History, knobs: dict[str, Any], n: int) -> dict[str, Any]:
        key = repr(sorted(knobs.items())) + f"|{n}"
        if key not in self._cache:
            g = history.goal
            self._cache[key] = self.simulator.predict_station(g.target, g.scenario, knobs, n, warmup=g.protocol.warmup,
                                                             seed=g.protocol.seeds[0], slos=g.view().slos() or None)
        return self._cache[key]

    def simulate(self, card: CandidateCard, history: History,
                 notes: list[str] | None = None) -> tuple[Prediction | None, str | None]:
        """(the simulator's prediction, why it is a predicted negative or None); a station it cannot simulate is
        said in `notes` (the plan carries them to the loop)."""
        goal = history.goal
        try:
            new, old = self._predict(history, card.knobs, card.n), self._predict(history, card.parent_knobs, card.n)
        except Exception as e:  # a station the profile cannot simulate: no pre-screen, the planner's card runs
            if notes is not None:
                notes.append(f"pre-screen of {card.title()} not possible: {e}")
            return None, None
        if new is None or old is None:
            return None, None
        view = goal.view()
        s_new, s_old = new.get("summary"), old.get("summary")
        if s_new is None or s_old is None:
            return None, None
        metric = f"{goal.objective.metric} (whole)"
        gain = relative(view.objective(s_new, "whole"), view.objective(s_old, "whole"))
        if gain is None:
            return None, None
        bound = view.binding(s_old)  # the limit with the least slack at the parent, as the simulator sees it
        lat = relative(bound.figure(s_new), bound.figure(s_old)) if bound is not None else None
        tpot = relative(s_new.tpot_ms.mean, s_old.tpot_ms.mean)
        ttft = relative(s_new.ttft_ms.mean, s_old.ttft_ms.mean)
        spread = max(CLEAR_LOSS, abs(gain) * DRIFT_THRESHOLD)  # the drift the check tolerates, as the interval
        pred = Prediction(source="simulator", objective=metric,
                          objective_effect=Interval(value=gain, lo=gain - spread, hi=gain + spread),
                          slo=bound.key if bound is not None else None,
                          slo_effect=None if lat is None else
                          Interval(value=lat, lo=lat - max(CLEAR_LOSS, abs(lat) * DRIFT_THRESHOLD),
                                   hi=lat + max(CLEAR_LOSS, abs(lat) * DRIFT_THRESHOLD)),
                          basis=f"the calibrated simulator ({new.get('profile')}): this station vs its parent at N={card.n}",
                          predicted={k: round(x, PREDICTED_DIGITS) for k, x in [(goal.objective.metric, view.objective(s_new, "whole"))]
                                     + [(lim.figure_key, lim.figure(s_new)) for lim in view.limits] if x is not None})
        latency_win = tpot is not None and ttft is not None and tpot <= -LATENCY_WIN and ttft <= 0
        broken = [lim for lim in view.limits if lim.figure(s_new) is not None and not lim.kept(lim.figure(s_new))]
        if broken:
            return pred, "predicted to break " + ", ".join(
                f"the {lim.words} limit ({lim.figure(s_new):.1f} ms >= {lim.limit_ms:g} ms)" for lim in broken)
        if gain < view.least_gain and not latency_win:
            return pred, f"predicted {effect(gain, tight=True)} {metric} (below the least gain {goal.stop.min_gain_pct:g} %, no latency win)"
        return pred, None


def _nth(i: int) -> str:
    return ORDINALS.get(i, f"{i}th")

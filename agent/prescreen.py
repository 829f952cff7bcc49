"""Offline pre-screening: when the goal's target has a calibrated profile, each screen the planner proposes is
first simulated (its station and its parent's, same scenario, N and seed) before any device time is spent.

A screen the simulator predicts negative (less than the goal's least gain with no latency win, or a break of the
TPOT limit) is set aside unrun: recorded as a note "predicted negative" with the prediction, its card cancelled,
and never a negative (no negative memory, no ruled-out hypothesis, no KPI). A person runs it anyway with the usual
instruction, e.g. `tuneloop instruct G one_more_round --knob KNOB=VALUE` (REST and chat alike): an instructed card
is never pre-screened. A screen that passes carries the simulator's numeric prediction (the hypothesis ledger's
source "simulator") in place of the value model's.
"""
from __future__ import annotations

from typing import Any

from agent.candidates import CandidateCard
from agent.history import History
from agent.judgement import CLEAR_LOSS, LATENCY_WIN
from agent.record import card_record
from core.ledger import Interval, Prediction, relative


def screened(card: CandidateCard, history: History) -> bool:
    """Whether this change was already measured at the screen N (its confirm follows a screen)."""
    return any(o.card.stage == "screen" and o.card.knobs_hash == card.knobs_hash for o in history.outcomes)

MAX_SKIPS = 32  # screens set aside in one planning step before the planner's own answer is taken


def calibrated(executor: Any, target: str) -> bool:
    t = (getattr(executor, "targets", None) or {}).get(target)
    return bool(getattr(t, "calibrated_profile", None)) and hasattr(executor, "predict_station")


class Prescreened:
    """A planner wrapper: asks the planner, simulates its screen, and asks again while the screen is predicted
    negative (each one recorded in the store)."""

    def __init__(self, inner: Any, executor: Any, store: Any):
        self.inner, self.executor, self.store = inner, executor, store
        self.name = getattr(inner, "name", "deterministic")
        self._cache: dict[str, dict[str, Any]] = {}

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)

    def ask(self, history: History) -> Any:
        for _ in range(MAX_SKIPS):
            plan = self.inner.ask(history)
            card = plan.card
            if card is None or card.change is None or card.stage not in ("screen", "confirm") \
                    or card.planner == "instruction" or (card.stage == "confirm" and screened(card, history)):
                return plan  # a confirm of a measured screen: the screen, not the simulator, predicts it
            pred, why = self.simulate(card, history)
            if pred is None:
                return plan
            if why is None:
                return plan.model_copy(update={"card": card.model_copy(update={"prediction": pred})})
            self.record(card, pred, why, history)
            history = history.model_copy(update={"predicted_negatives": history.predicted_negatives
                                                 | {card.station_key: why}})
        return self.inner.ask(history)

    def _predict(self, history: History, knobs: dict[str, Any], n: int) -> dict[str, Any]:
        key = repr(sorted(knobs.items())) + f"|{n}"
        if key not in self._cache:
            g = history.goal
            self._cache[key] = self.executor.predict_station(g.target, g.scenario, knobs, n, warmup=g.protocol.warmup,
                                                             seed=g.protocol.seeds[0])
        return self._cache[key]

    def simulate(self, card: CandidateCard, history: History) -> tuple[Prediction | None, str | None]:
        """(the simulator's prediction, why it is a predicted negative or None)."""
        goal = history.goal
        try:
            new, old = self._predict(history, card.knobs, card.n), self._predict(history, card.parent_knobs, card.n)
        except Exception as e:  # a station the profile cannot simulate: no pre-screen, the planner's card runs
            history.planner_notes.append(f"pre-screen of {card.title()} not possible: {e}")
            return None, None
        if new is None or old is None:
            return None, None
        metric = "output_tok_s_per_card" if goal.objective.metric.endswith("per_card") else "output_tok_s"
        gain = relative(new.get(metric), old.get(metric))
        tpot = relative(new.get("tpot_mean_ms"), old.get("tpot_mean_ms"))
        ttft = relative(new.get("ttft_mean_ms"), old.get("ttft_mean_ms"))
        if gain is None:
            return None, None
        limit = goal.constraints.tpot_mean_ms_lt
        spread = max(CLEAR_LOSS, abs(gain) * 0.15)  # the drift the check tolerates, as the interval
        pred = Prediction(source="simulator", objective=f"{goal.objective.metric} (whole)",
                          objective_effect=Interval(value=gain, lo=gain - spread, hi=gain + spread),
                          slo="tpot_mean_ms_lt" if limit is not None else None,
                          slo_effect=None if tpot is None or limit is None else
                          Interval(value=tpot, lo=tpot - max(CLEAR_LOSS, abs(tpot) * 0.15),
                                   hi=tpot + max(CLEAR_LOSS, abs(tpot) * 0.15)),
                          basis=f"the calibrated simulator ({new.get('profile')}): this station vs its parent at N={card.n}",
                          predicted={"output_tok_s": new.get("output_tok_s") or 0.0,
                                     "tpot_mean_ms": new.get("tpot_mean_ms") or 0.0})
        latency_win = tpot is not None and ttft is not None and tpot <= -LATENCY_WIN and ttft <= 0
        breaks = limit is not None and new.get("tpot_mean_ms") is not None and new["tpot_mean_ms"] >= limit
        if breaks:
            return pred, f"predicted to break the TPOT limit ({new['tpot_mean_ms']:.1f} ms >= {limit:g} ms)"
        if gain < goal.stop.min_gain_pct / 100.0 and not latency_win:
            return pred, f"predicted {gain:+.1%} {metric} (below the least gain {goal.stop.min_gain_pct:g} %, no latency win)"
        return pred, None

    def record(self, card: CandidateCard, pred: Prediction, why: str, history: History) -> None:
        """The card stored and cancelled unrun, and a note that says what was predicted (not a negative)."""
        rec = card_record(card.model_copy(update={"prediction": pred}))
        cand = self.store.add_candidate(history.goal_id, rec)
        if cand.status in ("proposed", "awaiting_approval"):
            self.store.set_candidate_status(cand.id, "cancelled", f"predicted negative (simulated, not measured): {why}")
        c = card.change
        assert c is not None
        self.store.record_decision(
            history.goal_id, "note", candidate_id=cand.id,
            text=(f"{card.title()}: predicted negative by the calibrated simulator, not run — {why}; a prediction, "
                  f"not a measured negative; to run it anyway: tuneloop instruct {history.goal_id} one_more_round "
                  f"--knob {c.knob}={c.new}"),
            data={"predicted_negative": {"experiment_key": card.experiment_key, "station_key": card.station_key,
                                         "knob": c.knob, "value": c.new,
                                         "why": why, "prediction": pred.model_dump(mode="json")}})

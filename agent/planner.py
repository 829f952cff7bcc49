"""The deterministic planner (the default; no LLM): history in, the next card or None out (ask/tell).

Order of business: a reference of the best station at screen N; then any promising screen is confirmed
(with a reference of its parent at confirm N first, so the comparison is like for like); then the
diagnosis of the best station's latest evidence ranks moves by value, each passed through `checks`.
None means stop: nothing left is worth its cost, or too many experiments in a row changed nothing.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from agent.candidates import CandidateCard, build_card, neighbours, rule_for, with_stage
from agent.checks import check, estimate, retry_note
from agent.diagnosis import Diagnosis, diagnose
from agent.history import History
from agent.value import Value, value_of

MIN_VALUE = 0.02  # below this a candidate is not worth its cost


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True)
    card: CandidateCard | None
    diagnosis: Diagnosis | None = None
    ranked: list[tuple[str, float, str]] = []  # (title, value, why or refusal) for the record
    stop_reason: str | None = None
    fallback: str | None = None  # why the LLM's proposal was not used (the deterministic one was)
    llm_hypotheses: list[dict] | None = None


def tpot_limit(goal) -> float | None:  # type: ignore[no-untyped-def]
    return goal.constraints.tpot_mean_ms_lt


def diagnosis_for(history: History) -> Diagnosis | None:
    ref = history.latest_valid(history.best_knobs)
    if ref is None or ref.summary is None:
        return None
    return diagnose(ref.summary, ref.evidence, tpot_limit(history.goal), history.best_knobs)


def _pending_confirm(history: History) -> CandidateCard | None:
    done = history.finished_keys
    for o in history.outcomes:
        if o.decision == "promising":
            conf = with_stage(o.card, "confirm", history.goal.protocol.confirm_n)
            if conf.experiment_key not in done:
                return conf
    return None


def _stale_streak(history: History) -> int:
    """Valid experiments in a row (screen/confirm) that changed no decision."""
    streak = 0
    for o in reversed(history.outcomes):
        if o.card.stage == "baseline" or o.verdict != "valid":
            continue
        if o.decision in ("negative",):
            streak += 1
        else:
            break
    return streak


def candidates(history: History, diag: Diagnosis | None) -> list[tuple[CandidateCard, Value]]:
    """Every one-change move from the best station over the goal's space, valued (unchecked)."""
    goal = history.goal
    ref = history.latest_valid(history.best_knobs)
    native_missing = ref is not None and ref.summary is not None and ref.summary.native is None
    out = []
    for knob, values in goal.space().items():
        cur = history.best_knobs.get(knob)
        for direction, new in neighbours(knob, cur, list(values)):
            try:
                card = build_card(history.goal_id, goal.scenario, history.best_knobs, knob, new, stage="screen",
                                  n=goal.protocol.screen_n, direction=direction)
            except Exception:  # a knob outside the catalog cannot become a card
                continue
            cost = estimate(card, history)
            v = value_of(card, rule_for(knob, direction), diag, cost, history.budget_left_card_hours, native_missing)
            out.append((card.model_copy(update={"score": v.value, "est_card_hours": round(cost, 4),
                                                "note": retry_note(card, history)}), v))
    out.sort(key=lambda cv: (-cv[1].value, cv[0].title()))
    return out


class DeterministicPlanner:
    name = "deterministic"

    def ask(self, history: History) -> Plan:
        goal = history.goal
        if history.experiments_left < 1:
            return Plan(card=None, stop_reason="experiment budget spent")
        ref = history.reference(history.best_knobs, goal.protocol.screen_n)
        if ref is None:
            card = build_card(history.goal_id, goal.scenario, history.best_knobs, None, None, stage="baseline",
                              n=goal.protocol.screen_n)
            return self._checked(card, history, None, "reference of the starting station")
        diag = diagnosis_for(history)
        conf = _pending_confirm(history)
        if conf is not None:
            if history.reference(conf.parent_knobs, conf.n) is None:
                base = build_card(history.goal_id, goal.scenario, conf.parent_knobs, None, None,
                                  stage="baseline", n=conf.n)
                return self._checked(base, history, diag, f"reference of the parent at N={conf.n} before confirming")
            return self._checked(conf, history, diag, "confirm a promising screen")
        if _stale_streak(history) >= goal.stop.max_without_improvement:
            return Plan(card=None, diagnosis=diag,
                        stop_reason=f"{goal.stop.max_without_improvement} experiments in a row changed nothing")
        ranked: list[tuple[str, float, str]] = []
        for card, v in candidates(history, diag):
            refusals = check(card, history)
            ranked.append((card.title(), v.value, "; ".join(refusals) or v.why))
            if refusals:
                continue
            if v.value < MIN_VALUE:
                return Plan(card=None, diagnosis=diag, ranked=ranked,
                            stop_reason=f"nothing left is worth its cost (best value {v.value:.3f} < {MIN_VALUE})")
            return Plan(card=card, diagnosis=diag, ranked=ranked)
        return Plan(card=None, diagnosis=diag, ranked=ranked, stop_reason=_no_candidate_reason(ranked, history))

    @staticmethod
    def _checked(card: CandidateCard, history: History, diag: Diagnosis | None, why: str) -> Plan:
        refusals = check(card, history)
        if refusals:
            return Plan(card=None, diagnosis=diag, ranked=[(card.title(), 0.0, "; ".join(refusals))],
                        stop_reason=f"cannot run the {why}: " + "; ".join(refusals))
        card = card.model_copy(update={"est_card_hours": round(estimate(card, history), 4)})
        return Plan(card=card, diagnosis=diag, ranked=[(card.title(), 1.0, why)])


def _no_candidate_reason(ranked: list[tuple[str, float, str]], history: History) -> str:
    """Why nothing passed: say so plainly when the budget is what refused the candidates left."""
    unaffordable = [r for r in ranked if "affordable:" in r[2]]
    if unaffordable and all("affordable:" in r[2] or "not_finished" in r[2] or "known_negative" in r[2]
                            for r in ranked):
        return (f"budget spent: none of the {len(unaffordable)} remaining candidate(s) is affordable "
                f"({history.budget_left_card_hours:.2f} card-h left)")
    return "no candidate passes the checks"

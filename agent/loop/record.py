"""Between the loop and the store: cards, outcomes and negatives written to and read back from `state.store`.

The store is the record of truth (LangGraph checkpoints are not): every planning step rebuilds the
History from here, so a restarted `tuneloop run` sees exactly what finished, what was approved and
what is still open. The warm station (History.warm_knobs) is derived here and only here: the station of the
last run that left its service healthy, or of a later healthy "go back to the best"; the loop hands it to
the executor as TrialSpec.parent_knobs, and the executor keeps no copy of its own.
"""
from __future__ import annotations

from typing import Any

from agent.planner import (CandidateCard, CostModel, Figures, History, Negative, Outcome, Plan, QualityFailure, Veto,
                           card_of, card_record)  # noqa: F401  (the store side reads cards here too)
from core.evidence import Evidence
from core.scenarios import load
from state.lifecycle import UNDECIDED, CandidateStatus
from state.snapshots import Conditions
from state.store import Store, best_of

# planner decision -> the store's decision kind
KIND = {"reference": "baseline", "negative": "negative", "promising": "promising", "window_pending": "promising", "new_best": "new_best",
        "tradeoff": "tradeoff", "quality_pending": "quality_pending", "quality_failed": "quality_failed",
        "fault": "fault", "invalid": "fault"}
CHANGED = ("new_best", "tradeoff", "quality_pending")
OPEN_STATUSES = (*UNDECIDED, CandidateStatus.APPROVED, CandidateStatus.RUNNING, CandidateStatus.FAILED,
                 CandidateStatus.UNKNOWN)


def outcome_data(outcome: str, verdict: str, figures: Figures | None, knobs: dict[str, Any]) -> dict[str, Any]:
    return {"outcome": outcome, "verdict": verdict, "knobs": knobs,
            "figures": figures.model_dump(mode="json") if figures else None}


def build_history(store: Store, goal_id: str, extra_notes: list[str] | None = None) -> History:
    goal = store.get_goal(goal_id)
    spec = goal.spec
    cands = {c.id: c for c in store.candidates(goal_id)}
    outcomes: list[Outcome] = []
    decisions = store.decisions(goal_id)
    best = best_of(decisions)  # the store's own rule for the best, on the decisions read once here
    best_knobs = dict(best.data["knobs"]) if best is not None and (best.data or {}).get("knobs") is not None \
        else spec.start_station()
    warm = None
    data_version, source = _scenario_version(spec.scenario), "sim"
    results = {r.run_id: r for r in store.results(goal_id)}  # one read, however many decisions there are
    restored = None  # the last "go back to the best" that came back healthy after the last warm run
    failures: list[QualityFailure] = []
    for d in decisions:
        data = d.data or {}
        if d.kind == "quality_failed" and d.candidate_id in cands:
            settings = QualityFailure.risky(card_of(cands[d.candidate_id].card).knobs)
            if settings:
                failures.append(QualityFailure(settings=settings, run_id=d.run_id))
            continue
        if d.kind == "restore" and d.station_hash and ((data.get("result") or {}).get("healthy")):
            restored = d.station_hash
            continue
        if "outcome" not in data or d.candidate_id not in cands:
            continue
        card = card_of(cands[d.candidate_id].card)
        res = results.get(d.run_id) if d.run_id else None
        tr = res.result if res else None
        if tr is not None:
            data_version = tr.data_version or data_version
            source = tr.source_identity or source
            if tr.healthy_after and data["verdict"] != "orchestration_fault":
                warm, restored = card.knobs, None
        figs = Figures.model_validate(data["figures"]) if data.get("figures") else None
        outcomes.append(Outcome(card=card, verdict=data["verdict"], decision=data["outcome"], figures=figs,
                                reason=d.text, run_id=d.run_id, summary=tr.summary if tr else None,
                                evidence=tr.evidence if tr else Evidence(), costs=list(tr.costs) if tr else [],
                                card_hours=tr.card_hours if tr else 0.0))
    if restored is not None:  # one read, whatever the number of decisions
        try:
            warm = dict(store.get_station(restored).knobs)
        except LookupError:  # restored from a run directory, never stored: the service runs a station we cannot name
            warm = None
    predicted = {d.data["predicted_negative"].get("station_key") or d.data["predicted_negative"]["experiment_key"]: d.text
                 for d in decisions
                 if d.kind == "note" and isinstance((d.data or {}).get("predicted_negative"), dict)}
    negatives = [Negative(knob=n.knob, value=n.value, scenario=n.conditions.scenario,
                          data_version=n.conditions.data_version or "", parent_knobs_hash=n.conditions.parent_hash or "",
                          source_identity=n.conditions.source_identity or "", experiment_key=n.run_id or str(n.id),
                          reason=n.reason)
                 for n in store.negatives(scenario=spec.scenario)]
    vetoes = [Veto(knob=v.knob, value=v.value, scenario=v.scenario, data_version=v.data_version or "",
                   parent_knobs_hash=v.parent_hash, source_identity=v.source_identity or "", source=v.source, who=v.who,
                   reason=v.reason, candidate_id=v.candidate_id, **_vetoed_pair(cands.get(v.candidate_id)))
              for v in store.vetoes(goal_id)]
    budget = store.budget(goal_id)
    runs = {r.id: r.n for r in store.runs(goal_id)}
    per_run: dict[str, list[Any]] = {}
    for e in store.ledger(goal_id):
        per_run.setdefault(e.run_id, []).append(e)
    cards = spec.constraints.cards or 16
    cost = CostModel.learn(cards, [(runs.get(rid, 0), es) for rid, es in per_run.items()])
    return History(goal_id=goal_id, goal=spec, data_version=data_version, source_identity=source,
                   best_knobs=best_knobs, warm_knobs=warm, outcomes=outcomes, negatives=negatives, vetoes=vetoes,
                   budget_left_card_hours=budget.card_hours_left, experiments_left=budget.experiments_left,
                   cost=cost, planner_notes=list(extra_notes or []), predicted_negatives=predicted,
                   quality_failures=failures)


def record_set_asides(store: Store, goal_id: str, plan: Plan) -> None:
    """Each screen the pre-screen set aside (agent/planner/prescreen.py) stored and cancelled unrun, with a note that
    says what was predicted: a prediction, never a measured negative."""
    for s in plan.set_aside:
        card, pred, why = s.card, s.prediction, s.why
        cand = store.add_candidate(goal_id, card_record(card.model_copy(update={"prediction": pred})))
        if cand.status in UNDECIDED:
            store.set_candidate_status(cand.id, "cancelled", f"predicted negative (simulated, not measured): {why}")
        c = card.change
        assert c is not None
        store.record_decision(
            goal_id, "note", candidate_id=cand.id,
            text=(f"{card.title()}: predicted negative by the calibrated simulator, not run — {why}; a prediction, "
                  f"not a measured negative; to run it anyway: tuneloop instruct {goal_id} one_more_round "
                  f"--knob {c.knob}={c.new}"),
            data={"predicted_negative": {"experiment_key": card.experiment_key, "station_key": card.station_key,
                                         "knob": c.knob, "value": c.new,
                                         "why": why, "prediction": pred.model_dump(mode="json")}})


def frozen_stations(store: Store, goal_id: str) -> dict[str, str]:
    """Each card's knobs digest -> the frozen station hash its run recorded (the executor's hash that
    `/stations/<hash>` and `tuneloop restore` resolve); the first run of those knobs names it."""
    cards = {c.id: c.card for c in store.candidates(goal_id)}
    out: dict[str, str] = {}
    results = None
    for r in store.runs(goal_id):
        h = r.station_hash
        if h is None:
            if results is None:
                results = {x.run_id: x.station_hash for x in store.results(goal_id)}
            h = results.get(r.id)
        if h and r.candidate_id in cards:
            out.setdefault(card_of(cards[r.candidate_id]).knobs_hash, h)
    return out


def conditions(card: CandidateCard, history: History) -> Conditions:
    return Conditions(scenario=card.scenario, parent_hash=card.parent_knobs_hash,
                      source_identity=history.source_identity, data_version=history.data_version)


def _scenario_version(name: str) -> str:

    return load(name).data_version


def _vetoed_pair(cand: Any) -> dict[str, Any]:
    """A rejected coupled pair's second change (and a jump's further ones), read from the card a person refused:
    the veto is of that pair or jump."""
    also = cand.card.get("also") if cand is not None else None
    more = tuple((c["knob"], c["new"]) for c in (cand.card.get("more") or ())) if cand is not None else ()
    return ({"also_knob": also["knob"], "also_value": also["new"]} if also else {}) | ({"more": more} if more else {})

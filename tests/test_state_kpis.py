"""Loop KPIs from the store, the authorisation decision, and budget estimates."""
from __future__ import annotations

import pytest

from core.station import Station as ExecStation
from core.trial import CostEntry, TrialSpec
from state.authorisation import decide, instruction_effect
from state.errors import NotValid
from state.goal import load_goal
from state.ledger import estimate
from state.snapshots import Conditions
from state.store import Store

TABLE = load_goal("examples/goal-16k.yaml").authorisation


def _run(store: Store, goal_id: str, rid: str, result, n: int = 640) -> None:
    store.create_run(TrialSpec(run_id=rid, goal_id=goal_id, target="sim", scenario="copy16k-zero-cache", knobs={},
                               n=n, stage="confirm"))
    store.record_result(result)


def _station(mpr: int) -> ExecStation:
    return ExecStation(engine="sim", knobs={"max_prefill_reqs": mpr}, scenario="copy16k-zero-cache",
                       data_version="d1", source_identity="sim@1", target="sim")


def test_kpis_from_a_small_history(store: Store, make_result):
    from state.kpis import compute_kpis

    g = store.create_goal(load_goal("examples/goal-16k.yaml"))
    empty = compute_kpis(store, g.id)
    assert empty.experiments == 0 and empty.decision_changing_share is None and empty.card_hours_per_point is None
    s1, s2 = store.put_station(_station(1)), store.put_station(_station(2))
    _run(store, g.id, "base320", make_result("base320", native=None, n=320), n=320)  # a screen: no native figure
    store.record_decision(g.id, "baseline", run_id="base320", station_hash=s1.hash, changed=True)
    _run(store, g.id, "base", make_result("base", native=180.0))
    store.record_decision(g.id, "baseline", run_id="base", station_hash=s1.hash, changed=True)
    _run(store, g.id, "cap2", make_result("cap2", native=234.0))
    store.record_decision(g.id, "new_best", run_id="cap2", station_hash=s2.hash, changed=True)
    _run(store, g.id, "seqs", make_result("seqs", native=175.0))
    cond = Conditions(scenario="copy16k-zero-cache", parent_hash=s2.hash, source_identity="sim@1", data_version="d1")
    store.add_negative("max_num_seqs", 128, cond, goal_id=g.id, run_id="seqs")
    store.record_decision(g.id, "negative", run_id="seqs", changed=False)
    _run(store, g.id, "seqs-again", make_result("seqs-again", native=176.0))
    store.add_negative("max_num_seqs", 128, cond, goal_id=g.id, run_id="seqs-again")  # a repeated negative
    _run(store, g.id, "crash", make_result("crash", verdict="orchestration_fault"))
    with pytest.raises(NotValid):
        store.add_negative("concurrency", 90, cond, goal_id=g.id, run_id="crash")
    k = compute_kpis(store, g.id)
    assert (k.experiments, k.valid_experiments) == (6, 5)
    assert k.decision_changing_share == pytest.approx(3 / 6)
    assert (k.repeated_negatives, k.invalid_negatives) == (1, 0)
    assert k.baseline_objective == 180.0 and k.best_objective == 234.0
    assert k.improvement_pct == pytest.approx(30.0)
    per_run = (300 + 120) * 16 / 3600
    assert k.card_hours_used == pytest.approx(6 * per_run)
    assert k.card_hours_per_point == pytest.approx(6 * per_run / 30.0)
    assert k.card_hours_to_first_valid_decision == pytest.approx(per_run)
    assert k.seconds_to_first_valid_decision is not None and k.seconds_to_first_valid_decision >= 0


@pytest.mark.parametrize("classes, left, cost, want", [
    ("hot", 10.0, 1.0, "auto"),
    ("restart", 10.0, 1.0, "auto"),
    ("relayout", 10.0, 1.0, "ask"),
    ("rebuild", 10.0, 1.0, "deny"),
    (["restart", "quality_risk"], 10.0, 1.0, "ask"),  # the strictest class wins
    ("hot", 0.5, 1.0, "ask"),  # over budget: never auto, ask for an extension
])
def test_decide(classes, left, cost, want):
    d = decide(classes, TABLE, left, cost)
    assert d.permission == want and d.reasons


def test_decide_over_budget_respects_a_denied_extension():
    table = dict(TABLE, budget_extension="deny")
    d = decide("hot", table, 0.1, 0.2)
    assert d.permission == "deny" and any("exceeds" in r for r in d.reasons)
    assert decide("hot", dict(TABLE, budget_extension="auto"), 0.1, 0.2).permission == "ask"
    assert decide("hot", TABLE, 5, 1, experiments_left=0).permission == "ask"
    assert decide("hot", TABLE, 5, 1, deadline_passed=True).permission == "ask"
    with pytest.raises(ValueError, match="action_class"):
        decide("warp", TABLE, 1, 1)


def test_instruction_effects():
    class I:  # the fields instruction_effect reads
        def __init__(self, kind, remaining=None):
            self.kind, self.remaining = kind, remaining

    assert [instruction_effect(I(k)) for k in ("pause", "resume", "stop", "restore")] == ["pause", "run", "stop", "restore"]
    assert instruction_effect(I("one_more_round", 1)) == "run"
    assert instruction_effect(I("one_more_round", 0)) == "stop"


def test_estimates_learn_from_the_goals_own_runs(store: Store, make_result):
    cold = estimate("restart", 640, 16, request_rate=6.0)
    assert cold == pytest.approx((10 + 30 + 300 + 640 / 6 * 1.25) * 16 / 3600)
    assert estimate("hot", 640, 16, request_rate=6.0) < cold < estimate("relayout", 640, 16, request_rate=6.0)
    g = store.create_goal(load_goal("examples/goal-16k.yaml"))
    _run(store, g.id, "r", make_result("r", load_s=160.0), n=640)
    store.charge("r", [CostEntry(what="restart", seconds=200, cards=16), CostEntry(what="load", seconds=160, cards=16)])
    warm = estimate("restart", 320, 16, entries=store.ledger(g.id), runs=store.runs(g.id), warmup=False)
    assert warm == pytest.approx((10 + 200 + 80) * 16 / 3600)

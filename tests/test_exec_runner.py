"""The executor on the sim target with the real Store (SQLite and PostgreSQL): phases, warm reuse, faults,
restore, refusals."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.evidence import Breakdown
from core.journal import as_record
from core.trial import PHASES, TrialSpec
from executor.phases import ExecSettings
from executor.runner import Executor
from state.store import Store

SCENARIO = """name: tiny-copy
version: 1
task: copy
input_len: 512
output_len: 64
seed: 7
"""


@pytest.fixture
def scenario(tmp_path) -> str:
    p = tmp_path / "tiny-copy.yaml"
    p.write_text(SCENARIO)
    return str(p)


@pytest.fixture
def ex(tmp_path, store_url) -> Executor:
    store = Store(store_url)  # once on SQLite, once on PostgreSQL (conftest's store_url)
    yield Executor(store, settings=ExecSettings(runs_root=tmp_path / "runs", holder="t:ex", lease_ttl_s=30))
    store.close()


def spec(scenario: str, run_id: str, **kw) -> TrialSpec:
    base = dict(run_id=run_id, goal_id="g", target="sim", scenario=scenario, n=24, seed=3,
                knobs={"concurrency": 8, "request_rate": "inf"})
    return TrialSpec.model_validate(base | kw)


def journal(ex: Executor, run_id: str):
    return [as_record(r) for r in ex.store.phases(run_id)]


def launches(ex: Executor) -> list[str]:
    log = ex.root / "_targets" / "sim" / "launch.log"
    return [line.split()[1:3] for line in log.read_text().splitlines()] if log.exists() else []


def test_valid_run_records_every_phase_and_is_idempotent(ex, scenario):
    r = ex.run_trial(spec(scenario, "r1"))
    assert r.verdict.kind == "valid", r.verdict
    assert r.summary is not None and r.summary.n_ok == 24 and r.healthy_after
    recs = journal(ex, "r1")
    seen = [(x.phase, x.event, x.status) for x in recs]
    for ph in PHASES:
        assert (ph, "intent", "started") in seen and (ph, "outcome", "ok") in seen, ph
    assert [x.phase for x in recs if x.event == "intent"] == list(PHASES)
    assert all(x.epoch == recs[1].epoch for x in recs[1:])  # everything after the lock carries its epoch
    assert {c.what for c in r.costs} >= {"restart", "weight_load", "warmup", "load"}
    assert r.station_hash and r.source_identity.startswith("simulator:") and r.data_version.startswith("tiny-copy@v1")
    again = ex.run_trial(spec(scenario, "r1"))
    assert again == r and len(journal(ex, "r1")) == len(recs)
    assert launches(ex).count(["start-run", "r1.load"]) == 1
    with pytest.raises(ValueError, match="already used for a different spec"):
        ex.run_trial(spec(scenario, "r1", n=25))


A = {"concurrency": 8, "request_rate": "inf"}
B = {"concurrency": 4, "request_rate": "inf"}
C = B | {"max_num_seqs": 64}
D = C | {"expert_layout": "static_eplb"}


def deploy_of(ex: Executor, run_id: str) -> dict:
    return [x for x in journal(ex, run_id) if x.phase == "deploy" and x.event == "outcome"][0].detail


def test_hot_change_reuses_the_warm_service_restart_change_restarts(ex, scenario):
    # as the loop does: each spec names the warm station (the store's history) as its parent_knobs
    ex.run_trial(spec(scenario, "a", knobs=A))
    hot = ex.run_trial(spec(scenario, "b", knobs=B, parent_knobs=A))
    dep = deploy_of(ex, "b")
    assert dep["restarted"] is False and dep["cost_class"] == "hot"
    assert "restart" not in {c.what for c in hot.costs}
    cold = ex.run_trial(spec(scenario, "c", knobs=C, parent_knobs=B))
    dep = deploy_of(ex, "c")
    assert dep["restarted"] is True and dep["cost_class"] == "restart"
    assert "restart" in {c.what for c in cold.costs}
    relay = ex.run_trial(spec(scenario, "d", knobs=D, parent_knobs=C))
    dep = deploy_of(ex, "d")
    assert dep["cost_class"] == "relayout" and dep["relayout_steps"][0] == "collect_expert_stats"
    assert "relayout" in {c.what for c in relay.costs}


def test_the_warm_station_is_the_specs_parent_not_a_file_of_the_executor(ex, scenario):
    """One source of truth for the warm station: the spec's parent_knobs (the store's history). A file where the
    executor once kept its own copy, corrupt here, is never read, and the same services on the target give
    the cost class the spec's parent says."""
    ex.run_trial(spec(scenario, "a", knobs=A))
    for junk in (ex.root / "_targets" / "sim.station.json", ex.root / "_targets" / "sim" / "station.json"):
        junk.parent.mkdir(parents=True, exist_ok=True)
        junk.write_text("{not json")
    assert ex.run_trial(spec(scenario, "b", knobs=B, parent_knobs=A)).verdict.kind == "valid"
    assert deploy_of(ex, "b")["restarted"] is False and deploy_of(ex, "b")["cost_class"] == "hot"
    ex.run_trial(spec(scenario, "c", knobs=C, parent_knobs=B))
    # the target runs C's services either way; only the parent the spec names decides the class of the change
    ex.run_trial(spec(scenario, "d1", knobs=D, parent_knobs=C))
    assert deploy_of(ex, "d1")["cost_class"] == "relayout"
    ex.run_trial(spec(scenario, "c2", knobs=C, parent_knobs=D))
    ex.run_trial(spec(scenario, "d2", knobs=D, parent_knobs=D | {"concurrency": 2}))  # a parent with D's layout
    assert deploy_of(ex, "d2")["restarted"] is True and deploy_of(ex, "d2")["cost_class"] == "restart"
    assert deploy_of(ex, "d2")["relayout_steps"] == []
    assert (ex.root / "_targets" / "sim.station.json").read_text() == "{not json"  # never written either


def test_launch_failure_is_an_orchestration_fault_with_the_server_text(ex, scenario):
    r = ex.run_trial(spec(scenario, "lf", faults=["launch_failure"]))
    assert r.verdict.kind == "orchestration_fault" and r.summary is None and not r.verdict.valid
    assert r.failed_phase == "health" and "launch_failure" in r.error
    out = [x for x in journal(ex, "lf") if x.phase == "health" and x.event == "outcome"][0]
    assert out.status == "failed" and out.error_class == "launch_failure"
    assert ["start-run", "lf.load"] not in launches(ex)  # nothing was sent, nothing counts as a result
    assert journal(ex, "lf")[-1].phase == "release"


def test_never_healthy_is_an_orchestration_fault(ex, scenario):
    r = ex.run_trial(spec(scenario, "nh", faults=["never_healthy"]))
    assert r.verdict.kind == "orchestration_fault" and r.verdict.reasons[0].code == "never_healthy"


def test_stats_failure_is_recollected_without_rerunning_the_load(ex, scenario):
    r = ex.run_trial(spec(scenario, "sf", faults=["stats_failure"]))
    col = [x for x in journal(ex, "sf") if x.phase == "collect" and x.event == "outcome"]
    assert [(c.status, c.error_class) for c in col] == [("failed", "collection_fault"), ("ok", None)]
    assert r.verdict.kind == "valid" and launches(ex).count(["start-run", "sf.load"]) == 1


def test_truncated_outputs_are_a_contract_violation(ex, scenario):
    r = ex.run_trial(spec(scenario, "tr", faults=["truncate=0.25"]))
    assert r.verdict.kind == "contract_violation"
    assert any(x.request_ids for x in r.verdict.reasons)


def test_metacharacter_knob_refused_at_prepare(ex, scenario):
    r = ex.run_trial(spec(scenario, "mc", knobs={"concurrency": 8, "max_num_seqs": "8; touch /tmp/pwned"}))
    assert r.verdict.kind == "orchestration_fault" and r.failed_phase == "prepare"
    assert "max_num_seqs" in r.error and "expected an integer" in r.error
    assert not launches(ex)


def test_restore_redeploys_the_frozen_station(ex, scenario):
    best = ex.run_trial(spec(scenario, "best", knobs={"concurrency": 8, "request_rate": "inf", "max_num_seqs": 64}))
    ex.run_trial(spec(scenario, "other", knobs={"concurrency": 8, "request_rate": "inf", "max_num_seqs": 32}))
    out = ex.restore(best.station_hash)
    assert out["healthy"] and out["identical"] and out["restarted"] is True, out
    with pytest.raises(LookupError, match="no run"):
        ex.restore("feedface")


def test_profile_capture_returns_the_sim_breakdown(ex, scenario):
    r = ex.run_trial(spec(scenario, "pc", profile_capture=True))
    assert r.verdict.kind == "valid" and isinstance(r.evidence.profile, Breakdown) and r.evidence.profile.role("decode")
    assert "profile" in {c.what for c in r.costs}
    assert ("profile", "outcome", "ok") in [(x.phase, x.event, x.status) for x in journal(ex, "pc")]


def test_unknown_target_refuses_work(ex, scenario, tmp_path):
    """One record of UNKNOWN: the store's run status. A run whose load was claimed with no process, rc or done marker
    makes its target UNKNOWN there (registered even though no loop created the run); every executor on that
    store refuses the target, whatever its runs root holds, until a person clears it."""
    from executor.phases import TargetUnknown

    s = spec(scenario, "x")
    (ex.root / "_targets" / "sim" / "runs" / "x.load").mkdir(parents=True)  # what a crash between claim and rc leaves
    r = ex.run_trial(s)
    assert [c.code for c in r.verdict.reasons] == ["unknown_state"]
    assert ex.store.get_run("x").status == "unknown" and set(ex.store.unknown_targets()) == {"sim"}
    assert not (ex.root / "_unknown").exists()  # no file of the executor's own
    with pytest.raises(TargetUnknown, match="UNKNOWN: run x"):
        ex.run_trial(spec(scenario, "u1"))
    other = Executor(ex.store, settings=ExecSettings(runs_root=tmp_path / "elsewhere", holder="t:ex2"))
    with pytest.raises(TargetUnknown):
        other.run_trial(spec(scenario, "u2"))
    assert ex.clear_unknown("sim", "alice", "checked by hand") == ["x"]
    assert ex.store.get_run("x").status == "failed" and "alice" in ex.store.get_run("x").status_reason
    assert ex.unknown_targets() == {} and other.run_trial(spec(scenario, "u1")).verdict.kind == "valid"


def test_targets_example_file_loads():
    from executor.targets import load_targets

    for p in Path(__file__).resolve().parents[1].glob("examples/targets*.yaml"):
        if "@" in p.read_text():  # a template with placeholders the llama.cpp test fills in (not a targets file yet)
            continue
        assert load_targets(p)

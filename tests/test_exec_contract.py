"""The goal's contract travels with the TrialSpec and the verdict judges against it; the cards in use come
from what the transport launched (instances x cards per instance), never from the record being checked."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from ports_support import free_ports

from core.summary import Contract
from core.trial import TrialSpec
from executor.phases import ExecSettings
from executor.runner import Executor
from executor.targets import Host, Target
from executor.templates import ServiceSpec
from executor.transports.local import LocalTransport
from state.goal import load_goal
from state.store import Store

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = "name: tiny-copy\nversion: 1\ntask: copy\ninput_len: 256\noutput_len: 32\nseed: 7\n"


@pytest.fixture
def scenario(tmp_path) -> str:
    p = tmp_path / "tiny-copy.yaml"
    p.write_text(SCENARIO)
    return str(p)


def _spec(scenario: str, run_id: str, target: str, knobs: dict, cards: int | None) -> TrialSpec:
    return TrialSpec(run_id=run_id, goal_id="g", target=target, scenario=scenario, n=16, seed=1,
                     knobs={"concurrency": 4, "request_rate": "inf"} | knobs,
                     contract=Contract(output_len=32, cards_required=cards))


def test_sim_target_with_a_prefill_instance_fewer_breaks_the_cards_contract(tmp_path, scenario):
    ex = Executor(Store(f"sqlite:///{tmp_path / 's.db'}"), settings=ExecSettings(runs_root=tmp_path / "runs"))
    full = ex.run_trial(_spec(scenario, "full", "sim", {"num_prefill_instances": 4}, 16))
    assert full.verdict.kind == "valid", full.verdict  # P 4 x 2 cards + D 1 x 8 cards = 16
    short = ex.run_trial(_spec(scenario, "short", "sim", {"num_prefill_instances": 3}, 16))
    assert short.verdict.kind == "contract_violation"
    (reason,) = short.verdict.reasons
    assert (reason.code, reason.count) == ("cards_missing", 2)
    assert "14 card(s) in use, the goal requires 16" in reason.message
    assert short.costs and {c.cards for c in short.costs} == {14}  # charged for the cards it really used
    loose = ex.run_trial(_spec(scenario, "loose", "sim", {"num_prefill_instances": 3}, None))
    assert loose.verdict.kind == "valid"  # the same run under a goal that requires no card count


def test_local_target_that_launches_one_instance_fewer_than_defined_breaks_the_cards_contract(tmp_path, scenario):
    """The target defines two 8-card engine hosts (16 cards), but the sim-serve template launches one instance
    only: the run must be judged on the 8 cards launched, not on the 16 the definition claims."""
    port, spare = free_ports(2)
    target = Target(name="loc", kind="local", engine="sim", run_root=str(tmp_path / "tgt"), time_scale=100.0,
                    tuneloop=(sys.executable, "-m", "tuneloop_cli"),
                    hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=8, port=port),
                           Host(host="127.0.0.2", roles=("mixed",), cards=8, port=spare)))
    assert target.cards == 16
    ex = Executor(Store(f"sqlite:///{tmp_path / 's.db'}"), {"loc": target},
                  ExecSettings(runs_root=tmp_path / "runs", holder="contract:local", poll_interval_s=0.05,
                               timeouts_s={"health": 60.0, "load": 120.0}))
    try:
        r = ex.run_trial(_spec(scenario, "loc-16", "loc", {}, 16))
        assert r.verdict.kind == "contract_violation", r.verdict
        assert [(x.code, x.count) for x in r.verdict.reasons] == [("cards_missing", 8)]
        ok = ex.run_trial(_spec(scenario, "loc-8", "loc", {}, 8))
        assert ok.verdict.kind == "valid", ok.verdict
        assert ok.summary is not None and ok.summary.cards == 8  # per-card figures over the cards launched
    finally:
        svc = ServiceSpec(name="sim-0", role="mixed", host="127.0.0.1", port=port, argv=("true",))
        asyncio.run(LocalTransport(target).stop_service(svc, 10**9))


def test_the_loop_hands_the_goal_contract_and_slos_to_the_executor(tmp_path):
    from agent.loop.session import run_session

    goal = load_goal(ROOT / "examples" / "goal-16k.yaml")
    spec = goal.model_copy(update={"budget": goal.budget.model_copy(update={"experiments": 1})})
    store_url = f"sqlite:///{tmp_path / 'loop.db'}"
    ex = Executor(Store(store_url), settings=ExecSettings(runs_root=tmp_path / "runs"))
    run_session(spec, store_url, auto_approve=True, executor=ex, new_goal=True)
    store = Store(store_url)
    runs = store.runs()
    assert runs
    trial = TrialSpec.model_validate(runs[0].spec)
    assert trial.contract == spec.contract() and trial.contract.cards_required == 16
    assert trial.slos == spec.slos()

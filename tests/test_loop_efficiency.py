"""Loop fixes from the tuner benchmark: a fault on a reference is retried (never a dead end), a goal is
simulated on its own profile whoever built the executor, `request_rate: .inf` survives the store, and
LangGraph's PostgreSQL checkpoint tables can be set up by several workers at once."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from agent.loop.session import run_session
from state.goal import load_goal, parse_goal
from state.store import Store
from tests.test_loop import goal_file, url

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def runs_root(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELOOP_RUNS_ROOT", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)


def test_launch_failure_on_the_confirm_n_reference_is_retried_as_a_new_run_not_a_dead_end(tmp_path):
    spec = load_goal(goal_file(tmp_path, budget={"experiments": 4}))

    def faults(card, n):  # the start's N=640 reference fails to launch on its first attempt only
        return ["launch_failure"] if card.stage == "baseline" and card.n == 640 and card.attempt == 1 else []

    res = run_session(spec, url(tmp_path), auto_approve=True, faults=faults)
    assert "already ran" not in res.reason
    st = Store(url(tmp_path))
    try:
        runs = st.runs(res.goal_id)
        ref640 = [r for r in runs if r.stage == "baseline" and r.n == 640]
        assert len(ref640) == 2 and ref640[1].id == ref640[0].id + "-a2"  # the same experiment, a fresh run
        assert st.get_result(ref640[0].id).verdict == "orchestration_fault"
        assert st.get_result(ref640[1].id).verdict == "valid"
        kinds = {d.run_id: d.kind for d in st.decisions(res.goal_id) if d.run_id}
        assert kinds[ref640[0].id] == "fault" and kinds[ref640[1].id] == "baseline"
        assert not [n for n in st.negatives(goal_id=res.goal_id) if n.run_id == ref640[0].id]
        assert any(r.stage != "baseline" for r in runs)  # and the loop went on (a move, screened or not)
    finally:
        st.close()


def llama_goal(**start):
    return parse_goal({
        "name": "llama-inf", "engine": "sim", "target": "sim", "sim_profile": "llama70b-h100-p2d2",
        "scenario": "chat2k", "objective": {"metric": "output_tok_s_per_card", "window": "whole"},
        "constraints": {"tpot_mean_ms_lt": 35, "all_succeed": True, "output_len": 512},
        "start_knobs": {"max_num_seqs": 64, "concurrency": 64, **start},
        "search_space": {"concurrency": [64, 128]}, "protocol": {"screen_n": 160, "confirm_n": 320},
        "authorisation": {"hot": "auto", "restart": "auto"}, "budget": {"card_hours": 50, "experiments": 1}}, "test")


@pytest.mark.parametrize("explicit_executor", [False, True])
def test_goal_runs_on_its_own_sim_profile_and_an_infinite_rate_survives_the_store(tmp_path, explicit_executor):
    from executor.phases import ExecSettings
    from executor.runner import Executor

    spec = llama_goal(request_rate=math.inf)
    executor = None
    if explicit_executor:  # an executor built without the goal in mind (bench, API worker): the sim target is dsv4
        executor = Executor(Store(url(tmp_path)), settings=ExecSettings.from_env(runs_root=tmp_path / "runs"))
    res = run_session(spec, url(tmp_path), auto_approve=True, executor=executor)
    st = Store(url(tmp_path))
    try:
        goal = st.get_goal(res.goal_id)
        assert goal.spec.start_knobs == spec.start_knobs and goal.spec.start_knobs["request_rate"] == math.inf
        [run] = st.runs(res.goal_id)
        assert run.spec["knobs"]["request_rate"] in ("inf", math.inf)
        result = st.get_result(run.id).result
        assert result.verdict.kind == "valid"
        assert "profile=llama70b-h100-p2d2" in result.source_identity
        assert result.summary.cards == 8  # P2 + D2 with TP2, not the dsv4 deployment's 16 cards
    finally:
        st.close()
    again = run_session(spec, url(tmp_path), auto_approve=True)  # the stored goal reads back and continues
    assert again.goal_id == res.goal_id


def test_several_workers_set_up_postgres_checkpoints_at_once(pg_url):
    code = ("import sys; from agent.loop.graph import setup_postgres; "
            "setup_postgres(sys.argv[1].replace('postgresql+psycopg://', 'postgresql://'))")
    procs = [subprocess.Popen([sys.executable, "-c", code, pg_url], cwd=ROOT, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    errs = [(p.wait(timeout=120), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
    assert all(rc == 0 for rc, _ in errs), [e[-800:] for _, e in errs]
    from agent.loop.graph import checkpointer, run_config

    with checkpointer(pg_url) as saver:
        assert saver.get_tuple(run_config("nobody")) is None  # tables exist and answer

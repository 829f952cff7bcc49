"""The bench scores every objective the goal schema allows (issue 43 item 6): the oracle, the baselines (both through
`bench.tuners.evaluate.Evaluator`) and the loop (`of_summary` on the executor's own runs) read the figure the goal
names, with the goal's SLOs, so goodput is a figure and not None ("no point of the space meets the constraints")."""
from __future__ import annotations

import pytest

from bench.tuner_efficiency import oracle
from bench.tuners.cases import Case, Settings
from bench.tuners.evaluate import Evaluator
from bench.tuners.loop import run_loop
from core import profiles, scenarios
from core.metrics import summarize
from core.station import full_knobs
from simulator import engine
from state.goal import parse_goal

METRICS = ("output_tok_s_per_card", "output_tok_s", "qps", "goodput")
LIMITS = {"ttft_p99_ms_lt": 10_000.0, "tpot_p99_ms_lt": 40.0}  # tail limits: goodput counts requests meeting both
SPACE = {"max_num_seqs": [32, 64, 128], "concurrency": [32, 64, 128]}
N = 160


def goal_data(metric: str, limits: dict[str, float] = LIMITS) -> dict:
    return {"name": f"obj-{metric}", "engine": "sim", "target": "sim", "sim_profile": "llama70b-h100-p2d2",
            "scenario": "chat2k", "objective": {"metric": metric, "window": "whole"},
            "constraints": {**limits, "all_succeed": True, "output_len": 512},
            "start_knobs": {"max_num_seqs": 32, "concurrency": 32}, "search_space": SPACE,
            "protocol": {"screen_n": 80, "confirm_n": N},
            "authorisation": {"hot": "auto", "restart": "auto"}, "budget": {"card_hours": 50, "experiments": 3}}


def expected(goal, knobs: dict, seed: int = 0) -> tuple[float | None, float]:
    """The goal's figure of one station measured apart from the bench (the simulator and summarize with the SLOs),
    and the station's qps."""
    prof, sc = profiles.load(goal.sim_profile), scenarios.load(goal.scenario)
    run = engine.simulate(prof, sc, full_knobs(goal.start_station() | knobs, "sim"), n=N, seed=seed)
    s = summarize(run.records, run.info, slos=goal.slos())
    return getattr(s.whole, goal.objective.metric), s.whole.qps


@pytest.mark.parametrize("metric", METRICS)
def test_the_evaluator_scores_each_objective_with_the_goals_slos(metric):
    goal = parse_goal(goal_data(metric))
    knobs = {"max_num_seqs": 64, "concurrency": 64}
    got = Evaluator(goal, None)(goal.start_station() | knobs, 0, N)
    want, qps = expected(goal, knobs)
    assert got.valid and want is not None and got.objective == pytest.approx(want)
    if metric == "goodput":
        assert 0 < got.objective <= qps  # requests meeting every SLO, a share of those completed


def test_goodput_counts_only_the_requests_that_meet_every_slo():
    loose = parse_goal(goal_data("goodput", {"ttft_p99_ms_lt": 60_000.0, "tpot_p99_ms_lt": 1000.0}))
    tight = parse_goal(goal_data("goodput", {"ttft_p99_ms_lt": 60_000.0, "tpot_p99_ms_lt": 22.0}))
    knobs = loose.start_station() | {"max_num_seqs": 128, "concurrency": 128}
    a, b = Evaluator(loose, None)(knobs, 0, N), Evaluator(tight, None)(knobs, 0, N)
    assert a.objective == pytest.approx(expected(loose, knobs)[1])  # every request meets a loose SLO: goodput = qps
    assert b.objective is not None and b.objective < 0.9 * a.objective


@pytest.mark.parametrize("metric", METRICS)
def test_the_oracle_finds_a_feasible_optimum_for_each_objective(metric, tmp_path):
    data = goal_data(metric)
    data.pop("search_space")
    case = Case(name=f"c-{metric}", goal=data, space=SPACE)
    got = oracle(case, False, Settings(), tmp_path / "cache")
    assert got["value"] is not None and got["feasible"] > 0, got
    best = Evaluator(case.goal_spec(False, 0), None)(case.goal_spec(False, 0).start_station() | got["point"], 0, N)
    assert best.feasible and best.objective == pytest.approx(got["value"])


def test_the_loop_scores_its_runs_with_the_goals_slos(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELOOP_RUNS_ROOT", str(tmp_path / "runs"))
    goal = parse_goal(goal_data("goodput"))
    res = run_loop(goal, profiles.load(goal.sim_profile), SPACE, workdir=tmp_path, twin=False)
    valid = [t for t in res["trials"] if t.verdict == "valid"]
    assert valid and all(t.objective is not None and t.objective > 0 for t in valid), res["stop_reason"]

"""A bench that cannot be lucky (issue 38): a seeded perturbed truth, a sim target that runs it while the goal names
the base profile (the planner's prior), and a case with no feasible point reported rather than fatal."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from core import profiles
from core.profiles import Profile
from simulator import perturb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MOE_MTP = "dsv4-flash-910c-p8d8"  # MoE with MTP: every perturbed part applies
CASE = "dsv4-chat2k"  # its quick space is 6 points and the loop stops after a few experiments


@pytest.fixture(autouse=True)
def runs_root(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELOOP_RUNS_ROOT", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("name", [MOE_MTP, "qwen3-235b-h800-p8d8", "llama70b-h100-p2d2"])
def test_perturbation_is_deterministic_bounded_valid_and_recorded(name, tmp_path):
    base = profiles.load(name)
    t = perturb.perturb(base, 3)
    assert t == perturb.perturb(base, 3) and t != perturb.perturb(base, 4)
    assert t.name == f"{name}-truth3" and "perturbed truth" in t.description
    Profile.model_validate(t.model_dump())
    f = perturb.factors_of(t)
    assert t.calibration["perturbed"]["base"] == name and t.calibration["perturbed"]["seed"] == 3
    for role, keys in (("prefill", perturb.PREFILL_KEYS), ("decode", perturb.DECODE_KEYS)):
        was, now = getattr(base, f"{role}_cost"), getattr(t, f"{role}_cost")
        for k in keys:
            assert perturb.COST_LO <= f[f"{role}.{k}"] <= perturb.COST_HI
            assert getattr(now, k) == pytest.approx(getattr(was, k) * f[f"{role}.{k}"], rel=1e-5)
    for task, alpha in base.acceptance.items():
        assert perturb.ACC_LO <= f[f"acceptance.{task}"] <= perturb.ACC_HI
        assert 0.0 <= t.acceptance[task] < 0.99
        assert t.acceptance[task] == pytest.approx(min(alpha * f[f"acceptance.{task}"], perturb.ALPHA_MAX), rel=1e-5)
    if base.decode_cost.ep > 1:
        for layout, skew in base.decode_cost.if_static.items():
            g = f[f"decode.if_static.{layout}"]
            assert perturb.COST_LO <= g <= perturb.COST_HI
            assert t.decode_cost.if_static[layout] - 1.0 == pytest.approx((skew - 1.0) * g, rel=1e-5, abs=1e-12)
    else:
        assert t.decode_cost.if_static == base.decode_cost.if_static
    # what a change costs and what the search space is stay the deployment's own
    assert (t.costs, t.prefill, t.decode, t.transfer, t.defaults) == (base.costs, base.prefill, base.decode,
                                                                      base.transfer, base.defaults)
    assert profiles.load(perturb.write(t, tmp_path / f"{t.name}.yaml")) == t  # the bench hands it over by path


def test_factors_spread_over_their_range():
    base = profiles.load(MOE_MTP)
    costs = [v for s in range(40) for k, v in perturb.factors_of(perturb.perturb(base, s)).items()
             if not k.startswith("acceptance")]
    assert min(costs) < 0.7 and max(costs) > 1.45  # not the identity, not a narrow band


def test_sim_target_measures_its_truth_and_the_planner_sees_only_the_base(tmp_path):
    from agent.loop.record import build_history
    from agent.loop.session import run_session
    from bench.tuners.cases import load_cases
    from bench.tuners.evaluate import Evaluator
    from executor.phases import ExecSettings
    from executor.runner import Executor
    from executor.targets import Target
    from state.store import Store

    case = next(c for c in load_cases(ROOT / "bench" / "scenarios.yaml").cases if c.name == CASE)
    goal = case.goal_spec(True, 0)
    truth = perturb.perturb(profiles.load(goal.sim_profile), 1)
    path = perturb.write(truth, tmp_path / "hidden" / f"{truth.name}.yaml")
    url = f"sqlite:///{tmp_path / 'tuneloop.db'}"
    store = Store(url)
    try:
        ex = Executor(store, {"sim": Target(name="sim", kind="sim", engine="sim", profile="llama70b-h100-p2d2",
                                            truth_profile=path)},
                      settings=ExecSettings.from_env(runs_root=tmp_path / "runs"))
        res = run_session(goal, url, auto_approve=True, executor=ex, who="test")
        # the goal's profile rebinds the target's prior; the truth stays
        assert ex.targets["sim"].profile == goal.sim_profile and ex.targets["sim"].truth_profile == path
        on_truth, on_base = Evaluator(goal, None, path), Evaluator(goal, None)
        runs = [r for r in store.runs(res.goal_id) if store.get_result(r.id) is not None]
        assert runs
        for r in runs:
            got = store.get_result(r.id).result
            spec = store.get_run(r.id).spec
            want = on_truth.measure(spec["knobs"], spec["seed"], spec["n"])
            base = on_base.measure(spec["knobs"], spec["seed"], spec["n"])
            assert got.summary.tpot_ms.mean == pytest.approx(want.tpot_mean_ms, rel=1e-9)
            assert abs(got.summary.tpot_ms.mean - base.tpot_mean_ms) > 0.02 * base.tpot_mean_ms
        history = build_history(store, res.goal_id, list(res.notes))
        seen = history.model_dump_json() + goal.model_dump_json() + "\n".join(res.notes)
        seen += "".join(str(d.text) + str(d.data) for d in store.decisions(res.goal_id))
        assert goal.sim_profile in history.source_identity
        for secret in (truth.name, "truth1", path, "hidden", "perturbed",
                       repr(truth.decode_cost.a), repr(truth.prefill_cost.b), repr(truth.acceptance["chat"])):
            assert secret not in seen, secret
    finally:
        store.close()


def test_a_case_with_no_feasible_point_is_reported_not_fatal(tmp_path):
    from bench.tuner_efficiency import oracle, run_case
    from bench.tuners.cases import Settings, load_cases
    from bench.tuners.report import write_table

    case = next(c for c in load_cases(ROOT / "bench" / "scenarios.yaml").cases if c.name == CASE)
    goal = dict(case.goal) | {"constraints": dict(case.goal["constraints"]) | {"tpot_mean_ms_lt": 0.5}}
    case = case.model_copy(update={"goal": goal, "quick_space": {"request_rate": [6]}})
    orc = oracle(case, True, Settings(), None)
    assert orc["value"] is None and orc["point"] is None and orc["feasible"] == 0 and orc["size"] == 1
    row = run_case(case, True, Settings(), None, lambda msg: None)
    assert row["no_feasible_point"] and "methods" not in row
    text = write_table({"quick": True, "cases": [row]}, tmp_path / "results.md")
    assert "No point of the space meets the constraints" in text and "with no feasible point left out" in text


def test_perturbed_case_runs_everything_on_the_truth_and_baselines_over_their_own_seeds(tmp_path):
    from bench.tuner_efficiency import perturbed_truth, run_case
    from bench.tuners.cases import Settings, load_cases
    from bench.tuners.evaluate import Evaluator
    from bench.tuners.report import write_table

    case = next(c for c in load_cases(ROOT / "bench" / "scenarios.yaml").cases if c.name == CASE)
    truth = perturbed_truth(case, True, 1, tmp_path)
    assert truth["name"] == f"{MOE_MTP}-truth1" and Path(truth["path"]).is_file() and truth["factors"]
    settings = Settings(quick_seeds=[0], quick_baseline_seeds=[1, 2])
    row = run_case(case, True, settings, tmp_path / "cache", lambda msg: None, truth=truth)
    # the truth is another deployment: its optimum measures otherwise on the base (one point, not the base's oracle)
    goal = case.goal_spec(True, settings.oracle_seed)
    on_base = Evaluator(goal, None)(goal.start_station() | row["optimum"]["point"], settings.oracle_seed,
                                    goal.protocol.confirm_n)
    assert row["optimum"]["value"] != pytest.approx(on_base.objective, rel=1e-6)  # same seed and N: deterministic
    assert row["profile"] == MOE_MTP and row["truth"] == truth  # the goal keeps the base
    assert [r["seed"] for r in row["methods"]["tuneloop"]["runs"]] == [0]
    for m in ("grid", "random", "tpe"):
        assert [r["seed"] for r in row["methods"][m]["runs"]] == [1, 2]  # the baselines' own seeds
    assert all(c["agree"] for c in row["charging_check"])
    assert {p.name for p in (tmp_path / "cache").iterdir()} == {truth["name"]}  # cached apart from the base
    text = write_table({"quick": True, "perturb_truth": 1, "cases": [row]}, tmp_path / "results.md")
    assert f"`{truth['name']}`" in text and "perturbed by `simulator.perturb` with seed 1" in text
    assert "geometric mean card-h ratio tuneloop / TPE" in text.split("## Summary", 1)[1]


def test_summary_lines_take_geometric_means_per_set():
    from bench.tuners.report import summary_lines

    def case(name, s, tpe, grid, reach):
        return {"name": name, "set": s, "target": {"tpe": {"ratio": tpe}, "grid": {"ratio": grid}},
                "methods": {"tuneloop": {"runs": [{"score": {"experiments_to_target": n}} for n in reach]}}}

    lines = summary_lines([case("a", "tune", 0.25, 0.1, [2, 3]), case("b", "tune", 1.0, 0.4, [5]),
                           case("c", "heldout", None, None, [None]), {"name": "d", "set": None,
                                                                      "no_feasible_point": True}])
    tune = next(x for x in lines if "**set tune**" in x)
    assert "tuneloop / TPE 0.500 over 2" in tune and "tuneloop / grid 0.200 over 2" in tune
    assert "worst vs TPE: `b` 1.000" in tune and "after the baseline 2 (3 loop runs)" in tune
    held = next(x for x in lines if "**set heldout**" in x)
    assert "1 where tuneloop did not reach left out" in held and "`c` (tuneloop did not reach)" in held
    assert "after the baseline not reached" in held
    assert any("**no set** (1 case, 1 with no feasible point left out)" in x for x in lines)
    assert any("**all cases** (4 cases" in x for x in lines)

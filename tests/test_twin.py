"""The goal's twin (executor/twin.py, agent/planner/twin.py, agent/planner/proposers/twin_search.py): a simulator
calibrated to the goal's own runs from a prior that is wrong, converging to the truth it was never handed; leading
the planner while it predicts the goal's runs, handing the lead to the rules when it does not, and the cards say so."""
from __future__ import annotations

from pathlib import Path

import pytest

from agent.loop.record import build_history
from agent.loop.session import run_session, twin_enabled
from agent.planner import twin as tw
from agent.planner.checks import check
from agent.planner.deterministic import candidates, diagnosis_for
from agent.planner.proposers.twin_search import LED, RULES_LED
from core import profiles
from executor.twin import Twin, Twins, prior_of
from executor.targets import builtin_sim
from simulator import engine, stations
from state.goal import parse_goal
from state.store import Store

PRIOR = "llama70b-h100-p2d2"
# the truth the runs come from: every decode and prefill step cost off the prior's by 30-60 %
FACTORS = {"decode_cost": {"a": 1.45, "b": 0.65, "c": 1.35}, "prefill_cost": {"a": 0.75, "b": 1.5}}
STATIONS = [{"max_num_seqs": 64, "concurrency": 64}, {"max_num_seqs": 128, "concurrency": 160},
            {"max_num_seqs": 32, "concurrency": 96}]


def truth_profile():
    p = profiles.load(PRIOR)
    upd = {part: getattr(p, part).model_copy(update={k: getattr(getattr(p, part), k) * f for k, f in fs.items()})
           for part, fs in FACTORS.items()}
    return p.model_copy(update={**upd, "name": f"{PRIOR}-truth"})


def _runs(root: Path, truth, stations_: list[dict]) -> tuple[str, ...]:
    ids = []
    for i, knobs in enumerate(stations_):
        rid = f"run{i}"
        engine.write_run_dir(engine.simulate(truth, "chat2k", truth.knobs(knobs, start=True), n=240, seed=i + 1),
                             root / rid / "load")
        ids.append(rid)
    return tuple(ids)


def test_the_twin_fitted_from_a_wrong_prior_converges_to_the_truth_it_was_never_handed(tmp_path):
    truth, prior = truth_profile(), profiles.load(PRIOR)
    ids = _runs(tmp_path, truth, STATIONS)
    twins = Twins(tmp_path)
    held_out = {"max_num_seqs": 96, "concurrency": 128}
    want = stations.predict(truth, "chat2k", held_out, 320, seed=5)["output_tok_s_per_card"]
    prior_err = stations.predict(prior, "chat2k", held_out, 320, seed=5)["output_tok_s_per_card"] / want - 1
    assert abs(prior_err) > 0.15  # the prior alone is far off
    errs = []
    for k in (1, 2, 3):
        fit = twins.fit(PRIOR, ids[:k])
        assert isinstance(fit, Twin), fit
        assert twins.fit(PRIOR, ids[:k]) is fit  # one fit per set of runs
        errs.append(fit.predict("chat2k", held_out, 320, seed=5)["output_tok_s_per_card"] / want - 1)
    coeffs = fit.coefficients()
    for name in ("decode.a", "decode.b", "decode.c", "prefill.b"):  # after 3 valid runs: within 10 % of the truth
        part, k = name.split(".")
        true = getattr(getattr(truth, f"{part}_cost"), k)
        assert coeffs[name][0] == pytest.approx(true, rel=0.10), (name, coeffs[name], true)
        assert coeffs[name][2] == "fitted"
    assert abs(errs[-1]) < 0.03 < abs(prior_err), (errs, prior_err)  # the runs won over the prior


def test_the_prior_is_the_calibrated_profile_or_the_goals_never_anything_else(tmp_path):
    sim = builtin_sim()
    assert prior_of(sim, PRIOR) == PRIOR and prior_of(sim, None) == sim.profile
    assert prior_of(sim.model_copy(update={"calibrated_profile": "x.yaml"}), PRIOR) == "x.yaml"
    assert prior_of(sim.model_copy(update={"kind": "ssh", "engine": "vllm"}), PRIOR) is None
    assert prior_of(None, PRIOR) is None
    assert "no valid run" in Twins(tmp_path).fit(PRIOR, ())
    assert "not under" in Twins(tmp_path).fit(PRIOR, ("missing",))


def test_twin_switch_reads_the_session_then_the_environment(monkeypatch):
    monkeypatch.delenv("TUNELOOP_TWIN", raising=False)
    assert twin_enabled(None) is False and twin_enabled(True) is True
    monkeypatch.setenv("TUNELOOP_TWIN", "on")
    assert twin_enabled(None) is True and twin_enabled(False) is False
    monkeypatch.setenv("TUNELOOP_TWIN", "maybe")
    with pytest.raises(ValueError, match="TUNELOOP_TWIN"):
        twin_enabled(None)


def goal(experiments: int) -> object:
    return parse_goal({
        "name": "twin-goal", "engine": "sim", "target": "sim", "sim_profile": PRIOR, "scenario": "chat2k",
        "objective": {"metric": "output_tok_s_per_card", "window": "whole"},
        "constraints": {"tpot_mean_ms_lt": 40, "all_succeed": True, "output_len": 512},
        "start_knobs": {"max_num_seqs": 32, "concurrency": 64},
        "search_space": {"max_num_seqs": [32, 64, 128], "concurrency": [64, 128, 256]},
        "protocol": {"screen_n": 160, "confirm_n": 320},
        "authorisation": {"hot": "auto", "restart": "auto"}, "budget": {"card_hours": 50, "experiments": experiments}},
        "test")


@pytest.fixture
def runs_root(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELOOP_RUNS_ROOT", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "runs"


def test_the_twin_leads_the_loop_and_its_cards_say_so_and_pass_the_same_checks(tmp_path, runs_root):
    url = f"sqlite:///{tmp_path / 't.db'}"
    res = run_session(goal(4), url, auto_approve=True, twin=True)
    st = Store(url)
    try:
        cands = [c.card for c in st.candidates(res.goal_id)]
        moves = [c for c in cands if c.get("change")]
        assert moves, res.reason
        first = moves[0]
        assert LED in (first.get("note") or "") and first["prediction"]["source"] == "twin"
        assert "calibrated to its 1 valid run" in first["prediction"]["basis"]
        runs = st.runs(res.goal_id)
        assert len({(r.stage, r.n, str(sorted(r.spec["knobs"].items()))) for r in runs}) == len(runs)  # none twice
        h = build_history(st, res.goal_id)
    finally:
        st.close()
    # the cards it proposes now pass the same checks as every other card: a measured station is refused
    measured = [o.card for o in h.outcomes if o.card.change is not None]
    assert measured and all(check(c, h) for c in measured)


def test_a_twin_whose_error_stays_high_hands_the_lead_to_the_rules_and_the_cards_say_so(tmp_path, runs_root):
    url = f"sqlite:///{tmp_path / 't.db'}"
    res = run_session(goal(4), url, auto_approve=True, twin=False)
    st = Store(url)
    try:
        h = build_history(st, res.goal_id)
    finally:
        st.close()
    assert len(tw.runs_of(h)) >= 3
    # a twin that cannot fit this deployment: every step twice as slow as the runs say, whatever the runs
    prior = profiles.load(PRIOR)
    wrong = prior.model_copy(update={"decode_cost": prior.decode_cost.model_copy(
        update={k: getattr(prior.decode_cost, k) * 2 for k in ("a", "b", "c")})})

    def fitter(runs):
        return Twin(profile=wrong, prior=PRIOR, runs=tuple(runs), table=[])

    fid = tw.fidelity(h, fitter)
    assert not fid.leads and len(fid.scored) >= 2 and all(s.miss for s in fid.scored[-2:])
    assert "missed its last 2 runs" in fid.why
    cards = candidates(h.with_twin(fitter), diagnosis_for(h))
    assert cards and all(f"{RULES_LED}: the twin missed" in (c.note or "") for c, _ in cards)
    assert not any(c.prediction is not None and c.prediction.source == "twin" for c, _ in cards)
    # the same history with the twin fitted to its runs: it predicts them, so it leads
    real = Twins(runs_root)
    fid = tw.fidelity(h, lambda runs: real.fit(PRIOR, tuple(runs)))
    assert fid.leads and all(abs(s.error) < 0.05 for s in fid.scored), fid.words()


def test_tuneloop_run_twin_flag_turns_it_on_for_the_session(tmp_path):
    import json
    import os
    import subprocess
    import sys

    spec = tmp_path / "goal.json"
    data = goal(2).model_dump(mode="json", exclude_none=True)
    spec.write_text(json.dumps(data))
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    env = os.environ | {"TUNELOOP_RUNS_ROOT": str(tmp_path / "runs"), "TUNELOOP_TWIN": "off"}
    exe = Path(sys.executable).with_name("tuneloop")
    for flag in ("--no-twin", "--twin"):
        proc = subprocess.run([str(exe), "run", str(spec), "--db", url, "--auto-approve", "--new", flag],
                              capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
    st = Store(url)
    try:
        goals = sorted(st.goals(), key=lambda g: g.created_at)
        notes = [[c.card.get("note") or "" for c in st.candidates(g.id) if c.card.get("change")] for g in goals]
    finally:
        st.close()
    assert len(notes) == 2 and notes[0] and notes[1]
    assert not any(LED in n for n in notes[0]) and all(LED in n for n in notes[1])


def test_in_the_loop_the_twin_fits_a_perturbed_truth_it_is_never_handed(tmp_path, runs_root):
    from executor.phases import ExecSettings
    from executor.runner import Executor
    from executor.targets import Target
    from simulator import perturb

    truth = perturb.perturb(profiles.load(PRIOR), 2)
    path = perturb.write(truth, tmp_path / "hidden" / f"{truth.name}.yaml")
    url = f"sqlite:///{tmp_path / 't.db'}"
    st = Store(url)
    try:
        ex = Executor(st, {"sim": Target(name="sim", kind="sim", engine="sim", profile=PRIOR, truth_profile=path)},
                      settings=ExecSettings.from_env(runs_root=runs_root))
        res = run_session(goal(5), url, auto_approve=True, executor=ex, twin=True)
        h = build_history(st, res.goal_id)
        cards = [c.card for c in st.candidates(res.goal_id)]
    finally:
        st.close()
    runs = tw.runs_of(h)[:3]  # after at most 3 valid runs
    assert len(runs) == 3
    fit = ex.twins.fit(PRIOR, tuple(o.run_id for o in runs))
    assert isinstance(fit, Twin) and fit.prior == PRIOR  # fitted from the prior, not the truth
    got = fit.coefficients()
    off = {}
    for name in ("decode.a", "decode.b", "decode.c"):
        part, k = name.split(".")
        true, prior = getattr(getattr(truth, f"{part}_cost"), k), getattr(getattr(profiles.load(PRIOR), f"{part}_cost"), k)
        off[name] = (got[name][0] / true - 1, prior / true - 1)
    assert max(abs(p) for _, p in off.values()) > 0.15, off  # the prior is wrong ...
    assert all(abs(f) < 0.10 for f, _ in off.values()), off  # ... and the fit lands within 10 % of the truth
    led = [c for c in cards if LED in (c.get("note") or "")]
    assert led and all(truth.name not in (c.get("note") or "") and path not in str(c) for c in cards)

"""The simulator's decode-side evidence and the profile library (issue 16): acceptance per draft position (vLLM's
per-position counters), expert load per EP rank (the run directory's expert_load.json), the breakdown's
imbalance / draft terms, and every library profile running a trial through the executor."""
from __future__ import annotations

import json

import numpy as np
import pytest

from core import profiles
from core import records as rec
from core.records import EngineSample
from core.trial import TrialSpec
from executor.evidence import digest_run, parse_prometheus
from executor.evidence_decode import expert_load, spec_accept_per_position
from executor.phases import ExecSettings
from executor.runner import Executor
from executor.targets import builtin_sim
from simulator import engine
from simulator.cluster import Cluster
from simulator.experts import rank_shares
from state.store import Store

# the library (profile, scenario): each profile's own case in bench/scenarios.yaml
LIBRARY = {
    "qwen3-235b-h800-p8d8": "chat2k-out1k",
    "qwen3-30b-a3b-910b-p4d4": "summarize8k",
    "deepseek-v3-910c-p4d8": "code4k",
    "llama31-8b-l40s-p1d1": "chat1k-out512",
    "llama33-70b-910b-p6d4": "chat3k-out768",
    "llama31-70b-h100-p8d4-tcp": "rag32k",
    "qwen25-32b-h100-p2d2": "chat512-out256",
    "llama31-8b-910b-p1d1": "chat2k-out512-agent",
}


def _digest(tmp_path, profile: str, scenario: str, knobs: dict, n: int = 160, seed: int = 0) -> dict:
    prof = profiles.load(profile)
    run = engine.simulate(prof, scenario, prof.knobs(dict(prof.start_knobs) | knobs), n=n, seed=seed)
    out = tmp_path / f"{profile}-{seed}-{abs(hash(json.dumps(knobs, sort_keys=True)))}"
    engine.write_run_dir(run, out)
    return digest_run(out, run.info)


def _survival(profile: str, task: str, k: int) -> np.ndarray:
    p = profiles.load(profile)
    return np.cumprod(p.acceptance[task] * p.acceptance_decay ** np.arange(k))


def test_acceptance_per_position_parses_from_the_exposition_and_matches_the_counters():
    """The scrape path: the cluster's /metrics text -> parse_prometheus -> the digest's per-position shares."""
    prof = profiles.load("deepseek-v3-910c-p4d8")
    cl = Cluster(prof, prof.start_knobs | {"num_speculative_tokens": 4}, seed=1, task="code", stream=False)
    for i in range(48):
        cl.submit(i, 1024, 256, [], 0.0)
    text0 = cl.metrics_text(1.0)
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{role="decode",instance="d0",position="3"}' in text0
    assert text0.count("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter") == 1
    s0 = EngineSample(t=1.0, role="decode", instance="d0", values=parse_prometheus(text0))
    s1 = EngineSample(t=200.0, role="decode", instance="d0", values=parse_prometheus(cl.metrics_text(200.0)))
    got = spec_accept_per_position([s0, s1])
    assert got is not None and len(got) == 4
    d = cl.decode[0]
    drafts = s1.values['vllm:spec_decode_num_drafts_total{role="decode",instance="d0"}'] \
        - s0.values['vllm:spec_decode_num_drafts_total{role="decode",instance="d0"}']
    assert drafts > 0 and d.success == 48  # every request finished: the counts are exact, not estimated
    assert got == pytest.approx([(a - b) / drafts for a, b in zip(
        d.accepted_per_position(),
        [s0.values[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{role="decode",instance="d0",position="{i}"}}']
         for i in range(4)])], rel=1e-4)
    # no spec decoding: no per-position evidence (None, never zeros)
    assert spec_accept_per_position([EngineSample(t=0, role="decode", instance="d0", values={"x": 1.0})]) is None


def test_acceptance_per_position_orders_as_each_profile_says(tmp_path):
    """Survival falls with position, at the profile's rate: slowly on the MTP-wins profile (α 0.88, decay 0.95),
    fast on the draft-loses one (α 0.6, decay 0.7); the per-position shares add up to the acceptance length."""
    wide = _digest(tmp_path, "deepseek-v3-910c-p4d8", "code4k", {"num_speculative_tokens": 4})
    narrow = _digest(tmp_path, "llama31-8b-l40s-p1d1", "chat1k-out512", {"num_speculative_tokens": 4})
    for ev, prof, task in ((wide, "deepseek-v3-910c-p4d8", "code"), (narrow, "llama31-8b-l40s-p1d1", "chat")):
        per = ev["spec_accept_per_position"]
        assert len(per) == 4 and all(a > b for a, b in zip(per, per[1:])), per
        assert per == pytest.approx(_survival(prof, task, 4).tolist(), abs=0.03)
        # spec_accept_length is SGLang's gauge averaged over scrapes (early ones are noisy): close, not equal
        assert 1 + sum(per) == pytest.approx(ev["spec_accept_length"], rel=0.05)
    # the last position's conditional acceptance: worth drafting on one profile, not on the other
    assert wide["spec_accept_per_position"][3] / wide["spec_accept_per_position"][2] > 0.7
    assert narrow["spec_accept_per_position"][3] / narrow["spec_accept_per_position"][2] < 0.45


def test_draft_width_pays_on_one_profile_and_not_the_other(tmp_path):
    """The draft's step cost follows the profile: k 1 -> 3 raises throughput where drafts are cheap and accepted,
    lowers it where they are not; breakdown.draft_s grows with k on both."""
    def fig(profile, scenario, k):
        prof = profiles.load(profile)
        run = engine.simulate(prof, scenario, prof.knobs(dict(prof.start_knobs) | {"num_speculative_tokens": k}), n=240, seed=0)
        return run.truth["whole_tok_s_per_card"], run.breakdown["decode"]["draft_s"] / run.breakdown["decode"]["elapsed_s"]
    w1, wd1 = fig("deepseek-v3-910c-p4d8", "code4k", 1)
    w3, wd3 = fig("deepseek-v3-910c-p4d8", "code4k", 3)
    n1, nd1 = fig("llama31-8b-l40s-p1d1", "chat1k-out512", 1)
    n3, nd3 = fig("llama31-8b-l40s-p1d1", "chat1k-out512", 3)
    assert w3 > 1.15 * w1 and n3 < 0.95 * n1, (w1, w3, n1, n3)
    assert wd3 > wd1 > 0 and nd3 > nd1 > 0


def test_expert_load_spread_larger_under_dynamic_than_static(tmp_path):
    """On the imbalance profile: per-rank load shares (sum 1, one per EP rank) spread wider under the default
    layout than under static EPLB, the step pays it (breakdown.imbalance_s) and throughput follows."""
    dyn = _digest(tmp_path, "qwen3-235b-h800-p8d8", "chat2k-out1k", {"expert_layout": "dynamic"})
    sta = _digest(tmp_path, "qwen3-235b-h800-p8d8", "chat2k-out1k", {"expert_layout": "static_eplb"})
    for ev in (dyn, sta):
        per = ev["expert_load"]["decode"]["per_rank"]
        assert len(per) == 8 and sum(per) == pytest.approx(1.0)
        assert ev["expert_load_spread"] == pytest.approx(max(per) * len(per))
    assert dyn["expert_load_spread"] == pytest.approx(1.45, rel=1e-6)
    assert sta["expert_load_spread"] == pytest.approx(1.06, rel=1e-6)
    share = {n: ev["breakdown"]["decode"]["imbalance_s"] / ev["breakdown"]["decode"]["elapsed_s"]
             for n, ev in (("dyn", dyn), ("sta", sta))}
    assert share["dyn"] > 1.5 * share["sta"] > 0
    # where imbalance does not dominate the spread stays near 1 and a dense model has no expert evidence at all
    small = _digest(tmp_path, "qwen3-30b-a3b-910b-p4d4", "summarize8k", {}, n=64)
    assert 1.0 < small["expert_load_spread"] < 1.05
    dense = _digest(tmp_path, "llama31-8b-910b-p1d1", "chat2k-out512-agent", {}, n=32)
    assert dense["expert_load"] is None and dense["expert_load_spread"] is None
    assert dense["breakdown"]["decode"]["imbalance_s"] == 0.0


def test_expert_load_record_file_and_bad_input(tmp_path):
    prof = profiles.load("qwen3-235b-h800-p8d8")
    run = engine.simulate(prof, "chat2k-out1k", prof.knobs({}, start=True), n=32, seed=0)
    engine.write_run_dir(run, tmp_path)
    raw = json.loads((tmp_path / rec.EXPERT_LOAD).read_text())
    d0 = raw["decode"]["d0"]
    assert d0["ep"] == 8 and d0["layout"] == "dynamic" and len(d0["per_rank_tokens"]) == 8
    assert d0["balancedness"] == pytest.approx(1 / 1.45, rel=1e-6)  # vLLM EPLB's log figure: mean / max
    # a record with nothing usable is no evidence (None), never a fake balance
    assert expert_load({"decode": {"d0": {"per_rank_tokens": []}}}) is None
    assert expert_load({"decode": "junk"}) is None and expert_load(None) is None
    for m in (1.0, 1.2, 3.0):
        s = rank_shares(16, m, seed=3)
        assert s.sum() == pytest.approx(1.0) and s.max() * 16 == pytest.approx(m)


@pytest.mark.parametrize("profile", sorted(LIBRARY))
def test_every_library_profile_runs_a_trial_through_the_executor(tmp_path, profile):
    """Each new profile loads and runs a short valid trial on the sim target (the executor's real path), and
    its evidence digest carries the new keys (present, or None where the deployment has no such evidence)."""
    prof = profiles.load(profile)
    assert prof.name == profile and "Calibration" in (profiles.builtin_dir() / f"{profile}.yaml").read_text()
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        ex = Executor(store, targets={"sim": builtin_sim(profile)},
                      settings=ExecSettings(runs_root=tmp_path / "runs", holder="t:lib", lease_ttl_s=30))
        spec = TrialSpec.model_validate(dict(run_id="r1", goal_id="g", target="sim", scenario=LIBRARY[profile],
                                             n=24, seed=0, knobs=dict(prof.start_knobs)))
        r = ex.run_trial(spec)
    finally:
        store.close()
    assert r.verdict.kind == "valid", r.verdict
    assert r.summary is not None and r.summary.n_ok == 24
    ev = r.evidence
    for key in ("spec_accept_per_position", "expert_load", "expert_load_spread"):
        assert key in ev
    assert {"imbalance_s", "draft_s"} <= set(ev["breakdown"]["decode"])
    k = prof.knobs({}, start=True)
    spec_on = k["speculative_method"] != "none" and int(k["num_speculative_tokens"]) > 0
    assert (ev["spec_accept_per_position"] is not None) == spec_on
    assert (ev["expert_load"] is not None) == (prof.decode_cost.ep > 1)

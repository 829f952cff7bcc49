"""The simulator's decode-side evidence and the profile library (issue 16): acceptance per draft position (vLLM's
per-position counters), expert load per EP rank (the run directory's expert_load.json), the breakdown's
imbalance / draft terms, and every library profile running a trial through the executor."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.tuners.cases import load_cases
from core import profiles
from core.evidence import Evidence
from core import records as rec
from core.records import EngineSample
from core.trial import TrialSpec
from executor.evidence import digest_run, parse_prometheus
from core.evidence_decode import expert_load, spec_accept_per_position
from executor.phases import ExecSettings
from executor.runner import Executor
from executor.targets import builtin_sim
from simulator import engine
from simulator.cluster import Cluster
from simulator.experts import rank_shares
from state.store import Store
from tests.test_sim_server import start_server

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
    # issue 38 item 7: four more kinds (a mixed engine, KV-capacity bound, dynamic EPLB + MTP, prefix-cache bound)
    "qwen25-7b-a100-mixed": "chat512-out256",
    "deepseek-v3-h200-p8d8": "chat2k",
    "llama31-8b-l4-p1d1-longctx": "docqa16k-out512",
    "qwen3-32b-910b-p2d4-agent": "agent12k-tools-out256",
}
# issue 43 item 6: goals of other shapes than output tok/s per card under a mean TPOT limit, on library profiles
# (case name: the set, the objective metric and the latency limits it is judged by)
GOAL_SHAPES = {
    "llama70b-h100-goodput-tail-slos": ("tune", "goodput", {"ttft_p99_ms_lt", "tpot_p99_ms_lt"}),
    "qwen25-7b-a100-mixed-ttft-tail": ("tune", "output_tok_s_per_card", {"ttft_p99_ms_lt", "tpot_p99_ms_lt"}),
    "llama33-70b-910b-qps-e2e-tail": ("heldout", "qps", {"e2e_p99_ms_lt"}),
    "llama31-8b-l40s-tok-s-ttft-p90-tpot-p99": ("heldout", "output_tok_s", {"ttft_p90_ms_lt", "tpot_p99_ms_lt"}),
}


def _digest(tmp_path, profile: str, scenario: str, knobs: dict, n: int = 160, seed: int = 0) -> Evidence:
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
    toks = np.concatenate([r.tokens for r in cl.finished])  # 1 + accepted drafts, per step of every request
    assert d.accepted_per_position() == [float((toks - 1 >= i + 1).sum()) for i in range(4)]
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
        per = ev.spec_accept_per_position
        assert len(per) == 4 and all(a > b for a, b in zip(per, per[1:])), per
        assert per == pytest.approx(_survival(prof, task, 4).tolist(), abs=0.03)
        # spec_accept_length is SGLang's gauge averaged over scrapes (early ones are noisy): close, not equal
        assert 1 + sum(per) == pytest.approx(ev.spec_accept_length, rel=0.05)
    # the last position's conditional acceptance: worth drafting on one profile, not on the other
    assert wide.spec_accept_per_position[3] / wide.spec_accept_per_position[2] > 0.7
    assert narrow.spec_accept_per_position[3] / narrow.spec_accept_per_position[2] < 0.45


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


def test_expert_load_spread_larger_under_the_default_placement_than_static(tmp_path):
    """On the imbalance profile: per-rank load shares (sum 1, one per EP rank) spread wider under the default
    layout than under static EPLB, the step pays it (breakdown.imbalance_s) and throughput follows."""
    dyn = _digest(tmp_path, "qwen3-235b-h800-p8d8", "chat2k-out1k", {"expert_layout": "none"})
    sta = _digest(tmp_path, "qwen3-235b-h800-p8d8", "chat2k-out1k", {"expert_layout": "static_eplb"})
    for ev in (dyn, sta):
        per = ev.expert_load["decode"].per_rank
        assert len(per) == 8 and sum(per) == pytest.approx(1.0)
        assert ev.expert_load_spread == pytest.approx(max(per) * len(per))
    assert dyn.expert_load_spread == pytest.approx(1.45, rel=1e-6)
    assert sta.expert_load_spread == pytest.approx(1.06, rel=1e-6)
    share = {n: ev.breakdown.role("decode").seconds("imbalance_s") / ev.breakdown.role("decode").seconds("elapsed_s")
             for n, ev in (("dyn", dyn), ("sta", sta))}
    assert share["dyn"] > 1.5 * share["sta"] > 0
    bd = dyn.breakdown.role("decode").raw  # a partition of the role's instance-seconds, every term >= 0 under a large skew
    parts = ("compute_s", "communication_s", "scheduling_s", "imbalance_s", "draft_s", "idle_s")
    assert min(bd[p] for p in parts) >= 0 and bd["compute_s"] > 0
    assert sum(bd[p] for p in parts) == pytest.approx(bd["elapsed_s"] * bd["instances"], rel=1e-6)
    # where imbalance does not dominate the spread stays near 1 and a dense model has no expert evidence at all
    small = _digest(tmp_path, "qwen3-30b-a3b-910b-p4d4", "summarize8k", {}, n=64)
    assert 1.0 < small.expert_load_spread < 1.05
    dense = _digest(tmp_path, "llama31-8b-910b-p1d1", "chat2k-out512-agent", {}, n=32)
    assert dense.expert_load is None and dense.expert_load_spread is None
    assert dense.breakdown.role("decode").seconds("imbalance_s") == 0.0


def test_each_expert_layout_has_its_skew_in_the_simulator():
    """none: the profile's measured skew of the engine's own placement; static_eplb: the fitted map's; dynamic (a
    layout rebalanced from live statistics): the fitted map's unless the profile measures dynamic EPLB itself."""
    dc = profiles.load("qwen3-235b-h800-p8d8").decode_cost
    assert (dc.skew("none"), dc.skew("static_eplb"), dc.skew("dynamic")) == (1.45, 1.06, 1.06)
    measured = dc.model_copy(update={"if_static": dc.if_static | {"dynamic": 1.2}})
    assert measured.skew("dynamic") == 1.2 and measured.skew("unknown") == 1.0


def test_expert_load_record_file_and_bad_input(tmp_path):
    prof = profiles.load("qwen3-235b-h800-p8d8")
    run = engine.simulate(prof, "chat2k-out1k", prof.knobs({}, start=True), n=32, seed=0)
    engine.write_run_dir(run, tmp_path)
    raw = json.loads((tmp_path / rec.EXPERT_LOAD).read_text())
    d0 = raw["decode"]["d0"]
    assert d0["ep"] == 8 and d0["layout"] == "none" and len(d0["per_rank_tokens"]) == 8
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
    assert set(Evidence.model_fields) <= set(ev.model_dump())  # every field explicit, None where missing
    assert {"imbalance_s", "draft_s"} <= set(ev.breakdown.role("decode").raw)
    k = prof.knobs({}, start=True)
    spec_on = k["speculative_method"] != "none" and int(k["num_speculative_tokens"]) > 0
    assert (ev.spec_accept_per_position is not None) == spec_on
    assert (ev.expert_load is not None) == (prof.decode_cost.ep > 1)


def test_serial_kv_link_caps_the_request_rate_per_decode_instance():
    """transfer.serial: KV transfers into one decode instance queue on its link, so the link's bandwidth caps the
    rate (requests wait with KV in flight: SGLang's decode transfer queue) and another decode instance adds a link."""
    prof = profiles.load("llama31-70b-h100-p8d4-tcp")
    tr = prof.transfer
    scen = "rag32k"
    qps = {}
    for d in (2, 3):
        run = engine.simulate(prof, scen, prof.knobs({"num_decode_instances": d}, start=True), n=48, seed=0)
        qps[d] = run.truth["qps"]
        per_req_s = 32768 * tr.kv_bytes_per_token / (tr.bandwidth_gb_s * 1e9)
        assert qps[d] <= d / per_req_s * 1.1, (d, qps[d], d / per_req_s)
        inbound = [s.values["sglang:num_decode_transfer_queue_reqs"] for s in run.samples if s.role == "decode"]
        assert max(inbound) >= 2  # several transfers queued on one link
    assert qps[3] > 1.3 * qps[2]
    # the same deployment with a parallel link is not bound by it
    free = prof.model_copy(update={"transfer": tr.model_copy(update={"serial": False})})
    run = engine.simulate(free, scen, free.knobs({}, start=True), n=48, seed=0)
    assert run.truth["qps"] > 1.3 * qps[2]


def test_sim_server_expert_distribution_recorder():
    """`tuneloop sim serve` answers SGLang's expert-distribution recorder endpoints: start, stop, dump (the
    record between start and stop, per EP rank, frozen after stop)."""
    p, url = start_server("--profile", "qwen3-235b-h800-p8d8", time_scale=50.0)  # the later --profile wins
    try:
        assert httpx.post(url + "/start_expert_distribution_record").json() == {"recording": True}
        for _ in range(4):
            r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "word " * 200, "max_tokens": 32},
                           timeout=60)
            assert r.status_code == 200, r.text
        assert httpx.post(url + "/stop_expert_distribution_record").json() == {"recording": False}
        first = httpx.post(url + "/dump_expert_distribution_record").json()
        d0 = first["decode"]["d0"]
        assert len(d0["per_rank_tokens"]) == 8 and sum(d0["per_rank_tokens"]) > 0
        assert d0["balancedness"] == pytest.approx(1 / 1.45, rel=1e-6)
        assert expert_load(first)["decode"]["max_over_mean"] == pytest.approx(1.45, rel=1e-6)
        httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "word " * 50, "max_tokens": 16}, timeout=60)
        assert httpx.post(url + "/dump_expert_distribution_record").json() == first  # stopped: frozen
    finally:
        p.kill()
        p.wait()


def test_library_cases_split_into_tune_and_heldout_and_contain_their_start():
    """bench/scenarios.yaml: one case per library profile on its scenario, six to tune on and six held out; four
    goal shapes on library profiles, two to tune on and two held out (each judged by its own objective and limits,
    none by the mean TPOT); each sweep contains the start station (so the grid's optimum is comparable with where a
    tuner begins)."""
    cf = load_cases(Path(__file__).resolve().parents[1] / "bench" / "scenarios.yaml")
    sets = [c for c in cf.cases if c.set is not None]
    lib = [c for c in sets if c.name not in GOAL_SHAPES]
    assert sorted(c.goal["sim_profile"] for c in lib) == sorted(LIBRARY)
    assert all(c.goal["scenario"] == LIBRARY[c.goal["sim_profile"]] for c in lib)
    assert sorted(c.set for c in lib) == ["heldout"] * 6 + ["tune"] * 6
    shapes = {c.name: c for c in sets if c.name in GOAL_SHAPES}
    assert sorted(shapes) == sorted(GOAL_SHAPES)
    for name, (set_, metric, limits) in GOAL_SHAPES.items():
        spec = shapes[name].goal_spec(False, 0)
        assert (shapes[name].set, spec.objective.metric, set(spec.constraints.latency_limits())) == \
            (set_, metric, limits), name
    assert any(profiles.load(c.goal["sim_profile"]).mixed for c in shapes.values())  # one on a mixed engine
    for c in sets:
        start = c.goal_spec(False, 0).start_station()
        for knob, values in c.space.items():
            assert start.get(knob) in values, (c.name, knob, start.get(knob), values)


def test_the_kv_hand_off_reads_as_a_real_nixl_pair_does(tmp_path):
    """A PD profile's decode instances count every prompt's KV as it arrives (vLLM's names: tokens by source, NIXL
    bytes and transfer time); the digest sums them over the run; a mixed deployment has no hand-off (None)."""
    prof = profiles.load("llama70b-h100-p2d2")
    ev = _digest(tmp_path, "llama70b-h100-p2d2", "chat2k-out1k", {}, n=64)
    kv = ev.kv_transfer
    assert kv.remote_share == 1.0 and kv.kv_tokens_computed == 0 and kv.failed == 0
    assert kv.kv_transfers > 0 and kv.kv_bytes == pytest.approx(
        kv.kv_tokens_remote * prof.transfer.kv_bytes_per_token)
    assert kv.transfer_s_mean >= prof.transfer.latency_s
    mixed = _digest(tmp_path, "vllm-cpu-mixed-sim", "vllm-chat", {}, n=16)
    assert mixed.kv_transfer is None

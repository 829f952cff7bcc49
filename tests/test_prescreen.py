"""Offline pre-screening through the real CLI: a target whose calibrated profile predicts a screen negative sets it
aside unrun (recorded with the prediction, never as a negative: no negative memory, no KPI); a person's
instruction runs it anyway, and the measurement, not the prediction, decides."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from agent.planner.cards import card_of, with_stage
from api.chatops.cards import rows
from core import profiles
from state.kpis import compute_kpis
from state.store import Store

TUNELOOP = Path(sys.executable).with_name("tuneloop")
GOAL = {"name": "llama-prescreen", "engine": "sim", "target": "simcal", "sim_profile": "llama70b-h100-p2d2",
        "scenario": "chat2k", "objective": {"metric": "output_tok_s_per_card", "window": "whole"},
        "constraints": {"tpot_mean_ms_lt": 200, "all_succeed": True},
        "start_knobs": {"max_num_seqs": 32, "max_prefill_reqs": 2, "concurrency": 128, "request_rate": float("inf")},
        "search_space": {"max_prefill_reqs": [1, 2, 4], "max_num_seqs": [32, 64]},
        "protocol": {"screen_n": 120, "confirm_n": 160, "warmup": 0, "native_min_requests": 16,
                     "native_min_seconds": 5, "seeds": [0]},
        "authorisation": {"hot": "auto", "restart": "auto", "budget_extension": "deny"},
        "budget": {"card_hours": 50, "experiments": 6}, "stop": {"max_without_improvement": 2, "min_gain_pct": 1.0}}


def _cli(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")} | {"TUNELOOP_RUNS_ROOT": str(tmp / "runs")}
    return subprocess.run([str(TUNELOOP), *args], cwd=tmp, env=env, capture_output=True, text=True, timeout=600)


def _setup(tmp: Path, calibrated: str) -> tuple[str, str]:
    (tmp / "goal.yaml").write_text(yaml.safe_dump(GOAL))
    (tmp / "targets.yaml").write_text(yaml.safe_dump({"targets": [{
        "name": "simcal", "kind": "sim", "profile": "llama70b-h100-p2d2", "calibrated_profile": calibrated,
        "run_root": str(tmp / "tgt")}]}))
    return str(tmp / "goal.yaml"), f"sqlite:///{tmp / 't.db'}"


def test_a_predicted_negative_is_set_aside_unrun_and_runs_on_request(tmp_path):
    # a "calibrated" profile that is wrong about decode: per-token cost only, so a wider batch is predicted to
    # gain nothing and to break the TPOT limit (the target's truth gains ~17 %)
    flat = profiles.load("llama70b-h100-p2d2").model_dump()
    flat["name"], flat["decode_cost"]["a"], flat["decode_cost"]["b"] = "llama-flat-decode", 0.0, 5e-3
    (tmp_path / "flat.yaml").write_text(yaml.safe_dump(flat, sort_keys=False))
    goal, db = _setup(tmp_path, str(tmp_path / "flat.yaml"))
    run = _cli(tmp_path, "run", goal, "--targets", "targets.yaml", "--db", db, "--auto-approve")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "predicted negative by the calibrated simulator" in run.stdout
    store = Store(db)
    try:
        (g,) = store.goals()
        notes = [d for d in store.decisions(g.id) if (d.data or {}).get("predicted_negative")]
        # the wrong-way move the flat profile predicts over the TPOT limit is set aside (others may be too)
        seqs = [d for d in notes if (d.data["predicted_negative"]["knob"], d.data["predicted_negative"]["value"])
                == ("max_num_seqs", 64) and store.get_candidate(d.candidate_id).card.get("also") is None]
        assert len(seqs) == 1, [d.text for d in notes]
        pn = seqs[0].data["predicted_negative"]
        assert "TPOT limit" in pn["why"]
        assert pn["prediction"]["source"] == "simulator" and pn["prediction"]["predicted"]["tpot_mean_ms"] >= 200
        for note in notes:
            cand = store.get_candidate(note.candidate_id)
            assert cand.status == "cancelled" and cand.status_reason.startswith("predicted negative (simulated, not measured)")
            assert not any(r.candidate_id == cand.id for r in store.runs(g.id))  # no device time spent on it
        assert store.negatives(goal_id=g.id) == []  # never a measured negative
        assert [d.kind for d in store.decisions(g.id) if d.kind == "negative"] == []
        k = compute_kpis(store, g.id)
        assert k.experiments == len(store.runs(g.id)) and k.invalid_negatives == k.repeated_negatives == 0
        report = next((tmp_path / "reports").glob("*/report.md")).read_text()
        assert "predicted negative (a prediction, not a measured negative)" in report
        assert f"tuneloop instruct {g.id} one_more_round --knob max_num_seqs=64" in report
        gid = g.id
    finally:
        store.close()
    ins = _cli(tmp_path, "instruct", gid, "one_more_round", "--knob", "max_num_seqs=64", "--db", db)
    assert ins.returncode == 0, ins.stderr
    again = _cli(tmp_path, "run", goal, "--targets", "targets.yaml", "--db", db, "--auto-approve")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    store = Store(db)
    try:
        ran = [d for d in store.decisions(gid) if d.run_id and "max_num_seqs 32 -> 64" in d.text]
        # measured, and the prediction was wrong: the best station has a confirm-N reference only, so the
        # instructed change runs there and is a new best (the target's truth gains ~17 %)
        assert len(ran) == 1 and ran[0].kind == "new_best", [d.text for d in store.decisions(gid)]
        card = store.get_candidate(ran[0].candidate_id).card
        assert card["planner"] == "instruction" and card["stage"] == "confirm"
    finally:
        store.close()


def test_a_right_profile_passes_the_screen_with_the_simulators_prediction(tmp_path):
    goal, db = _setup(tmp_path, "llama70b-h100-p2d2")  # the target's own truth as its calibration
    run = _cli(tmp_path, "run", goal, "--targets", "targets.yaml", "--db", db, "--auto-approve")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    store = Store(db)
    try:
        (g,) = store.goals()
        skipped = [d.data["predicted_negative"] for d in store.decisions(g.id) if (d.data or {}).get("predicted_negative")
                   and store.get_candidate(d.candidate_id).card.get("also") is None]  # single changes
        assert all(p["knob"] == "max_prefill_reqs" for p in skipped)  # the prefill cap does not bind: no gain
        ran = {r.candidate_id for r in store.runs(g.id)}
        # every change that ran without a screen of it before (a screen, or a move straight to confirm) was
        # simulated first and carries the simulator's prediction
        ran_cards = [c for c in store.candidates(g.id) if c.id in ran and c.card.get("change")]
        first = [c for c in ran_cards if c.card["stage"] == "screen" or not any(
            o.card["stage"] == "screen" and o.card["knobs_hash"] == c.card["knobs_hash"] and o.id < c.id
            for o in ran_cards)]
        assert first and all(c.card["prediction"]["source"] == "simulator" for c in first)
        assert first[0].card["change"]["knob"] == "max_num_seqs"
        sc = first[0].card["prediction"]
        assert sc["objective_effect"]["value"] > 0.05  # the wider decode batch is predicted to gain
        obs = next(d for d in store.decisions(g.id) if d.candidate_id == first[0].id and "observed" in (d.data or {}))
        assert abs(obs.data["observed"]["objective_effect"] - sc["objective_effect"]["value"]) < 0.05  # same model
    finally:
        store.close()


def _first_move(tmp: Path, calibrated: str | None) -> tuple[dict, list[str]]:
    """Run the loop (decode-bound start with MTP k=1: a wider batch and more drafts both help) and return the first
    move that ran and the planner's ranked list recorded with it."""
    spec = GOAL | {"start_knobs": GOAL["start_knobs"] | {"max_prefill_reqs": 4, "request_rate": 10000,
                                                        "speculative_method": "mtp", "num_speculative_tokens": 1},
                   "search_space": {"num_speculative_tokens": [1, 2, 3], "max_num_seqs": [32, 64]},
                   "budget": {"card_hours": 50, "experiments": 3}}
    (tmp / "goal.yaml").write_text(yaml.safe_dump(spec))
    target = {"name": "simcal", "kind": "sim", "profile": "llama70b-h100-p2d2", "run_root": str(tmp / "tgt")}
    (tmp / "targets.yaml").write_text(yaml.safe_dump({"targets": [target | (
        {"calibrated_profile": calibrated} if calibrated else {})]}))
    db = f"sqlite:///{tmp / 't.db'}"
    # the rules' moves, pre-screened or not: the goal's twin (on by default) leads with its own search instead, and
    # fitted on the baseline it picks the three drafts itself (its tests: tests/test_twin*.py)
    run = _cli(tmp, "run", str(tmp / "goal.yaml"), "--targets", "targets.yaml", "--db", db, "--auto-approve",
               "--no-twin")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    store = Store(db)
    try:
        (g,) = store.goals()
        ran = {r.candidate_id for r in store.runs(g.id)}
        first = next(c for c in store.candidates(g.id) if c.id in ran and c.card.get("change"))
        return first.card, [r[0] for r in first.card.get("ranked") or []]
    finally:
        store.close()


def test_passing_moves_are_reranked_by_the_simulated_value_per_card_hour(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "cal").mkdir()
    plain, _ = _first_move(tmp_path / "plain", None)
    card, ranked = _first_move(tmp_path / "cal", "llama70b-h100-p2d2")
    name = lambda c: [(x["knob"], x["new"]) for x in (c["change"], c.get("also")) if x]  # noqa: E731
    # without a calibrated profile the planner's own first move runs first; with one, the move the simulator
    # values most per card-hour (three drafts: the largest simulated gain, and a screen is the cheaper card)
    assert name(card) == [("num_speculative_tokens", 3)] and name(plain) != name(card)
    assert "ranked first of" in card["prescreen"] and "by simulated value per card-hour" in card["prescreen"]
    assert f"(its first: " in card["prescreen"] and card["prediction"]["source"] == "simulator"
    assert "ranked first of" not in (card.get("note") or "")  # the ranking is a field of its own, not the note's
    # shown on the card a person approves; the confirm of the same change is a card of its own, without the ranking
    assert ("pre-screen", card["prescreen"]) in rows(card, "h", None, None, None)
    assert with_stage(card_of(card), "confirm", 640).prescreen is None
    assert card["prediction"]["objective_effect"]["value"] > 0.05 and "ranked first of" in card["prediction"]["basis"]
    assert any(t.startswith(card["stage"]) and "num_speculative_tokens 1 -> 3" in t for t in ranked)

"""Instructions and requests the loop carries out besides experiments: "go back to the best" and profile capture."""
from __future__ import annotations

import pytest

from agent.diagnosis import diagnose
from agent.planner import DeterministicPlanner, Plan
from agent.record import build_history
from agent.session import run_session
from core.summary import Dist, Summary, WindowFigures
from state.goal import load_goal
from state.store import Store
from tests.test_loop import goal_file, url


@pytest.fixture(autouse=True)
def runs_root(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELOOP_RUNS_ROOT", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)


def test_go_back_to_the_best_restores_it_through_the_executor_and_records_who_asked(tmp_path):
    spec = load_goal(goal_file(tmp_path, budget={"experiments": 3}))
    # the reference (cap 1) at N=640, then confirms straight away (supported hypotheses): cap 2 (the new
    # best), then the token budget (no native window: not the best), which the warm service is left running
    first = run_session(spec, url(tmp_path), auto_approve=True)
    st = Store(url(tmp_path))
    try:
        best = st.best_station(first.goal_id)
        assert best is not None
        assert build_history(st, first.goal_id).warm_knobs != best.knobs  # the cap-2 screen runs warm
        st.add_instruction(first.goal_id, "restore", "carol")
    finally:
        st.close()
    res = run_session(spec, url(tmp_path), auto_approve=True)
    assert res.goal_id == first.goal_id and res.status == "stopped" and "carol" in res.reason
    st = Store(url(tmp_path))
    try:
        [d] = [d for d in st.decisions(res.goal_id) if d.kind == "restore"]
        assert d.data["asked_by"] == "carol" and d.station_hash == best.hash
        out = d.data["result"]
        assert out["healthy"] and out["identical"] and out["station"] == best.hash
        assert out["restarted"]  # the warm service ran the token-budget confirm: going back needed a restart
        assert st.current_instruction(res.goal_id) is None  # carried out once, no longer in force
        assert len([r for r in st.runs(res.goal_id) if r.stage != "restore"]) == 3  # no experiment was run
        # the store's history (the one source of the warm station) knows the service now runs the best again
        assert build_history(st, res.goal_id).warm_knobs == best.knobs
    finally:
        st.close()


class QueuesCannotSeparate(DeterministicPlanner):
    """The deterministic planner on a target whose queues do not separate the explanations (scripted diagnosis)."""

    def ask(self, history):  # type: ignore[no-untyped-def]
        plan = super().ask(history)
        d = Dist(n=320, mean=9.0, p50=9.0, p90=10.0, p99=12.0)
        w = WindowFigures(kind="whole", start=0, end=100, duration=100, n_requests=320, output_tokens=1e6,
                          output_tok_s=1e4, output_tok_s_per_card=180.0, qps=2.0, achieved_concurrency=120.0)
        s = Summary(n_total=320, n_formal=320, n_sent=320, n_ok=320, n_failed=0, cards=16, concurrency=128,
                    request_rate=6.0, whole=w, native=None, ttft_ms=d, tpot_ms=d, itl_ms=d, e2e_ms=d,
                    queue_delay_ms=d, output_len_min=1024, output_len_max=1024)
        diag = diagnose(s, {"kv_usage_max": 0.99}, 20.0, {})  # no queue series collected
        assert diag.propose_profile
        return Plan(card=plan.card, diagnosis=diag, ranked=plan.ranked, stop_reason=plan.stop_reason)


def test_profile_capture_is_requested_when_queues_cannot_separate_and_authorised_as_profile(tmp_path):
    spec = load_goal(goal_file(tmp_path, budget={"experiments": 3},
                               authorisation={"hot": "auto", "restart": "auto", "profile": "ask"}))
    planner = QueuesCannotSeparate()
    first = run_session(spec, url(tmp_path), planner=planner)
    assert first.status == "waiting"  # the reference ran; the next card asks for a profile, and that is "ask"
    card = first.waiting_for["card"]
    assert card["profile_capture"] and card["profile_reason"] and "profile -> ask" in first.waiting_for["why"]
    res = run_session(spec, url(tmp_path), planner=planner, resume={"decision": "approve", "who": "dave"})
    st = Store(url(tmp_path))
    try:
        runs = st.runs(res.goal_id)
        assert len(runs) >= 2
        prof = runs[1]
        assert st.get_candidate(prof.candidate_id).card["profile_capture"]
        assert any(p.phase == "profile" and p.event == "outcome" and p.status == "ok" for p in st.phases(prof.id))
        assert any(e.what == "profile" for e in st.ledger(res.goal_id) if e.run_id == prof.id)  # charged
        assert not any(p.phase == "profile" for p in st.phases(runs[0].id))  # the reference asked for none
        later = [st.get_candidate(r.candidate_id).card for r in runs[2:]]
        assert not any(c["profile_capture"] and c["parent_knobs_hash"] == card["parent_knobs_hash"] for c in later)
    finally:
        st.close()

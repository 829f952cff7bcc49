"""Instructions and requests the loop carries out besides experiments: "go back to the best" and profile capture."""
from __future__ import annotations

import pytest

from agent.planner.diagnosis import diagnose
from planner_support import TPOT20
from agent.planner.deterministic import DeterministicPlanner, Plan
from agent.loop.record import build_history
from agent.loop.session import run_session
from core.summary import Dist, Summary, WindowFigures
from state.goal import load_goal
from state.store import Store
from tests.test_loop import goal_file, url


@pytest.fixture(autouse=True)
def runs_root(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELOOP_RUNS_ROOT", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)


def test_go_back_to_the_best_restores_it_through_the_executor_and_records_who_asked(tmp_path):
    spec = load_goal(goal_file(tmp_path, budget={"experiments": 2}))
    # the reference (cap 1), then the twin's jump to its optimum, which does not become the best (here: no valid
    # native window at this goal's N): the reference stays the best, the jump's station is left running warm
    first = run_session(spec, url(tmp_path), auto_approve=True)
    st = Store(url(tmp_path))
    try:
        best = st.best_station(first.goal_id)
        assert best is not None
        assert build_history(st, first.goal_id).warm_knobs != best.knobs  # the jump runs warm
        restore = st.add_instruction(first.goal_id, "restore", "carol")
        pause = st.add_instruction(first.goal_id, "pause", "dan")  # sent after it: it must not cancel the restore
    finally:
        st.close()
    res = run_session(spec, url(tmp_path), auto_approve=True)
    # the restore ran first, then the pause held: both carried out, in the order given, and both recorded
    assert res.goal_id == first.goal_id and res.status == "paused" and "dan" in res.reason
    st = Store(url(tmp_path))
    try:
        outcome = {i.id: i.outcome for i in st.instructions(res.goal_id)}
        assert outcome[restore.id].startswith("done: went back to station ") and "carol" in outcome[restore.id]
        assert outcome[pause.id] == "done: the goal paused"
        [d] = [d for d in st.decisions(res.goal_id) if d.kind == "restore"]
        assert d.data["asked_by"] == "carol" and d.station_hash == best.hash
        out = d.data["result"]
        assert out["healthy"] and out["identical"] and out["station"] == best.hash
        assert out["restarted"]  # the warm service ran the jump: going back needed a restart
        assert st.current_instruction(res.goal_id).id == pause.id  # the restore is carried out, the pause holds
        assert len([r for r in st.runs(res.goal_id) if r.stage != "restore"]) == 2  # no experiment was run
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
        diag = diagnose(s, {"decode_kv_usage_max": 0.99}, TPOT20, {})  # no queue series collected
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


KINDS = ("pause", "resume", "stop", "one_more_round", "round_at", "restore")  # round_at: one more round at a value


@pytest.fixture(scope="module")
def ended_goal(tmp_path_factory):
    """A goal on the simulator that ran its budget (2 experiments) and ended: the starting point of every pair."""
    base = tmp_path_factory.mktemp("ended")
    spec = load_goal(goal_file(base, budget={"experiments": 2}))
    import os
    old = os.environ.get("TUNELOOP_RUNS_ROOT")
    os.environ["TUNELOOP_RUNS_ROOT"] = str(base / "runs")
    try:
        res = run_session(spec, url(base), auto_approve=True)
    finally:
        os.environ.pop("TUNELOOP_RUNS_ROOT") if old is None else os.environ.__setitem__("TUNELOOP_RUNS_ROOT", old)
    return base, res.goal_id


@pytest.mark.parametrize("first,second", [(a, b) for a in KINDS for b in KINDS])
def test_every_pair_of_instructions_ends_with_both_recorded(ended_goal, tmp_path, monkeypatch, first, second):
    """Two instructions sent one after the other to an ended goal, then the loop runs: each has an outcome (done,
    superseded by the other, refused, not done with why); none is dropped, and none is superseded silently: the
    moment the second is given, either it is refused (the same kind, the first still to be carried out) or what it
    replaced already says so (what the person is told at once, api/actions.py `standing`)."""
    import shutil

    base, gid = ended_goal
    shutil.copytree(base, tmp_path / "w", dirs_exist_ok=True)
    monkeypatch.setenv("TUNELOOP_RUNS_ROOT", str(tmp_path / "w" / "runs"))
    spec = load_goal(tmp_path / "w" / "goal.yaml")
    st = Store(url(tmp_path / "w"))
    try:
        at = {"concurrency": spec.space()["concurrency"][-1]}
        sent = [st.add_instruction(gid, "one_more_round" if k == "round_at" else k, f"person-{n}",
                                   count=1 if k in ("one_more_round", "round_at") else None,
                                   knobs=at if k == "round_at" else None)
                for n, k in enumerate((first, second))]
        told = {i.id: i.outcome for i in st.instructions(gid)}  # right after the second was given
        same = sent[0].kind == sent[1].kind
        assert (told[sent[1].id] or "").startswith(f"refused: instruction {sent[0].id} ") == same, told
        if not same and (told[sent[0].id] or "").startswith("superseded"):
            assert told[sent[0].id].startswith(f"superseded by {sent[1].id} ")
    finally:
        st.close()
    run_session(spec, url(tmp_path / "w"), auto_approve=True)
    st = Store(url(tmp_path / "w"))
    try:
        got = {i.id: i for i in st.instructions(gid)}
        for ins in (got[s.id] for s in sent):
            assert ins.outcome, (first, second, [(i.kind, i.active, i.outcome) for i in got.values()])
        # what the first was replaced by names the second
        if first != "restore" and second != "restore" and got[sent[0].id].outcome.startswith("superseded"):
            assert got[sent[0].id].outcome.startswith(f"superseded by {sent[1].id} ")
    finally:
        st.close()

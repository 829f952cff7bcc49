"""The loop stops by itself: the budget ends, a run's state is UNKNOWN, a person pauses it while a run is in flight."""
from __future__ import annotations

from pathlib import Path

import pytest

from agent.loop.session import run_session
from state.goal import load_goal
from state.store import Store
from tests.test_loop import goal_file, url
from tests.test_loop_cli import tuneloop


@pytest.fixture(autouse=True)
def runs_root(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELOOP_RUNS_ROOT", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)


def test_budget_runs_out_midway_no_unaffordable_run_is_launched(tmp_path):
    # ~0.7 card-h per hot 320-request run on the warm service and ~4 card-h with a restart (the cost model's
    # first guesses): 5 card-h pays for the reference and one more run, not for what the planner wants next.
    spec = load_goal(goal_file(tmp_path, budget={"card_hours": 5, "experiments": 8}))
    res = run_session(spec, url(tmp_path), auto_approve=True)
    st = Store(url(tmp_path))
    try:
        b = st.budget(res.goal_id)
        runs = st.runs(res.goal_id)
        assert 1 <= len(runs) < spec.budget.experiments  # stopped mid-way, not by the experiment count
        assert b.card_hours_used <= spec.budget.card_hours  # the ledger never goes past the budget
        assert res.status == "done" and "budget spent" in res.reason, res.reason
        stop = [d for d in st.decisions(res.goal_id) if d.kind == "stop"]
        assert stop and stop[-1].text == res.reason
        # every launched run was affordable when it was launched (estimate <= what was left then)
        left = spec.budget.card_hours
        for r in runs:
            card = st.get_candidate(r.candidate_id).card
            assert card["est_card_hours"] is not None and card["est_card_hours"] <= left + 1e-9
            left -= sum(e.card_hours for e in st.ledger(res.goal_id) if e.run_id == r.id)
        # running again changes nothing: no unaffordable run is launched later either
        again = run_session(spec, url(tmp_path), auto_approve=True)
        assert len(st.runs(res.goal_id)) == len(runs) and again.goal_id == res.goal_id
    finally:
        st.close()


def test_unknown_run_state_stops_the_loop_and_no_new_work_is_issued(tmp_path):
    """A load directory claimed on the target with no process, no rc and no done marker is UNKNOWN."""
    spec = load_goal(goal_file(tmp_path, authorisation={"hot": "ask", "restart": "ask"}))
    first = run_session(spec, url(tmp_path))
    assert first.status == "waiting"
    st = Store(url(tmp_path))
    try:
        cand = st.get_candidate(first.waiting_for["candidate_id"])
        run_id = f"{first.goal_id}-{cand.card['stage']}-{cand.card['experiment_key']}"
        # the state a crash between claim and rc leaves behind: the claim exists, nothing else
        (tmp_path / "runs" / "_targets" / "sim" / "runs" / f"{run_id}.load").mkdir(parents=True)
        st.approve(cand.id, cand.card_hash, "alice")
        res = run_session(spec, url(tmp_path))
        assert res.status == "stopped" and "UNKNOWN" in res.reason
        assert [r.status for r in st.runs(first.goal_id)] == ["unknown"]
        assert st.get_result(run_id) is None or st.get_result(run_id).verdict != "valid"
        assert not st.negatives(goal_id=first.goal_id)  # an unknown state is never a result
        # a restart issues no new work until a person resolves it
        again = run_session(spec, url(tmp_path), auto_approve=True)
        assert again.status == "stopped" and "UNKNOWN" in again.reason
        assert len(st.runs(first.goal_id)) == 1
        assert "UNKNOWN" in Path(again.state_path or "").read_text()
        # the store's run status is the one record: the executor refuses the target from it, no file of its own
        assert set(st.unknown_targets()) == {"sim"} and not (tmp_path / "runs" / "_unknown").exists()
        listed = tuneloop(tmp_path, "exec", "unknown", "--db", url(tmp_path))
        assert listed.returncode == 0 and listed.stdout.startswith(f"sim: run {run_id}"), listed
        # a person re-verifies the target (the stale claim removed) and clears it: the loop finishes that run
        (tmp_path / "runs" / "_targets" / "sim" / "runs" / f"{run_id}.load").rmdir()
        cleared = tuneloop(tmp_path, "exec", "unknown", "--db", url(tmp_path), "--clear", "sim", "--who", "bob")
        assert cleared.returncode == 0 and f"run(s) {run_id}" in cleared.stdout, cleared
        assert st.unknown_targets() == {} and "bob" in (st.get_run(run_id).status_reason or "")
        bad = tuneloop(tmp_path, "exec", "unknown", "--db", url(tmp_path), "--clear", "../sim")
        assert bad.returncode == 2 and "--clear" in bad.stderr and "is not UNKNOWN" in bad.stderr, bad
        done = run_session(spec, url(tmp_path), auto_approve=True)
        assert st.get_run(run_id).status == "done" and st.get_result(run_id).verdict == "valid", done
    finally:
        st.close()


def test_pause_while_a_run_is_in_flight_is_honoured_at_the_next_phase_boundary(tmp_path):
    spec = load_goal(goal_file(tmp_path))
    paused: list[str] = []

    def on_event(phase: str, info: dict) -> None:
        if phase == "execute" and not paused:  # the run is launched: a person says "pause" now
            st = Store(url(tmp_path))
            try:
                gid = st.goals()[-1].id
                st.add_instruction(gid, "pause", "alice")
                paused.append(gid)
            finally:
                st.close()

    res = run_session(spec, url(tmp_path), auto_approve=True, on_event=on_event)
    assert res.status == "paused" and "alice" in res.reason
    st = Store(url(tmp_path))
    try:
        runs = st.runs(res.goal_id)
        assert len(runs) == 1 and runs[0].status == "done"  # the run in flight finished and was kept ...
        judged = [d for d in st.decisions(res.goal_id) if d.run_id == runs[0].id and "outcome" in (d.data or {})]
        assert len(judged) == 1  # ... and judged; nothing launched after the pause
        st.add_instruction(res.goal_id, "resume", "alice")
    finally:
        st.close()
    # resuming continues the same goal from where it paused
    res2 = run_session(spec, url(tmp_path), auto_approve=True, on_event=None)
    st = Store(url(tmp_path))
    try:
        assert res2.goal_id == res.goal_id and len(st.runs(res.goal_id)) > 1
    finally:
        st.close()


def test_the_loop_never_stops_with_an_infeasible_best_while_budget_remains(tmp_path):
    """A start ~25 % above its TPOT limit (bench case llama33-70b-910b-above-slo): the loop gets feasible first, and
    it stops only once the best meets the SLO or the budget is spent."""
    from tests.rules_support import goal_of

    goal = goal_of("llama33-70b-910b-above-slo")
    spec = goal.model_copy(update={"budget": goal.budget.model_copy(update={"experiments": 6})})
    res = run_session(spec, url(tmp_path), auto_approve=True)
    st = Store(url(tmp_path))
    try:
        ds = st.decisions(res.goal_id)
        assert ds[0].kind == "baseline" and ds[0].data["figures"]["slo_violations"]  # the start breaks it
        best = st.best(res.goal_id)
        feasible = best is not None and not best.data["figures"]["slo_violations"]
        assert feasible or "budget spent" in res.reason, res.reason
        assert feasible  # six experiments are enough to get inside the limit here
        assert any("meets the SLO the reference breaks" in d.text for d in ds)
    finally:
        st.close()


def test_a_tooling_fault_is_retried_on_its_own_line_and_the_stop_reason_says_so(tmp_path):
    """A baseline whose deployment never becomes healthy (an orchestration fault, the tooling's, not the station's)
    is retried as a new attempt and does not take one of the person's two experiments; the stop says what it cost."""
    spec = load_goal(goal_file(tmp_path, budget={"experiments": 2}))
    res = run_session(spec, url(tmp_path), auto_approve=True, faults=lambda card, n: ["never_healthy"] if n == 0 else [])
    st = Store(url(tmp_path))
    try:
        runs = st.runs(res.goal_id)
        b = st.budget(res.goal_id)
        assert [r.status for r in runs][0] == "failed" and runs[0].status_reason == "orchestration_fault"
        assert len(runs) == 3 and b.tooling_faults == 1 and b.experiments_used == 2  # both experiments measured
        assert sum(st.get_result(r.id).verdict == "valid" for r in runs[1:]) == 2
        assert "1 run ended in a tooling fault, retried on their own line and not counted in the experiments" \
            in res.reason, res.reason
        (stop,) = [d for d in st.decisions(res.goal_id) if d.kind == "stop"]
        assert stop.text == res.reason and res.reason.count("tooling fault") == 1  # said once, as recorded
    finally:
        st.close()

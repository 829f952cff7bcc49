"""The one storage test suite: every test runs on SQLite and on PostgreSQL (the `store` fixture)."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.station import Station as ExecStation
from core.trial import TrialSpec
from state.authorisation import instruction_effect
from state.errors import Conflict, InvalidTransition, NotFound, NotValid, Stale, StaleEpoch
from state.goal import load_goal
from state.lifecycle import OutcomeKind, WaitingFor
from state.snapshots import Conditions
from state.store import Store

GOAL = "examples/goal-16k.yaml"


def _goal(store: Store):
    return store.create_goal(load_goal(GOAL))


def _station(**knobs) -> ExecStation:
    return ExecStation(engine="sim", knobs={"max_prefill_reqs": 1, "concurrency": 128} | knobs,
                       scenario="copy16k-zero-cache", data_version="copy16k@v1:abc", source_identity="sim@1",
                       target="sim")


def _run(store: Store, goal_id: str, run_id: str, stage: str = "screen", n: int = 320, **kw):
    return store.create_run(TrialSpec(run_id=run_id, goal_id=goal_id, target="sim", scenario="copy16k-zero-cache",
                                      knobs={"max_prefill_reqs": 2}, stage=stage, n=n), **kw)


def test_goal_round_trip_is_frozen_and_reopened(store: Store):
    g = _goal(store)
    got = store.get_goal(g.id)
    assert got.spec == load_goal(GOAL) and got.status == "running"
    with pytest.raises(ValidationError):
        got.spec.constraints.tpot_mean_ms_lt = 40  # the loop cannot change the SLO
    with pytest.raises(ValidationError):
        got.status = "done"
    assert store.open_goal(load_goal(GOAL)).id == g.id  # a restarted `tuneloop run` continues the same goal
    with pytest.raises(NotFound):
        store.get_goal("nope")
    with pytest.raises(InvalidTransition):
        store.set_goal_status(g.id, "bogus")
    assert store.set_goal_status(g.id, "paused", "user asked").status_reason == "user asked"
    store.set_goal_status(g.id, "running")
    waiting = store.set_goal_status(g.id, "waiting", "waiting for a budget extension of 1.00 card-hours",
                                    WaitingFor.BUDGET_EXTENSION)
    assert waiting.waits_for_extension and store.get_goal(g.id).waiting_for is WaitingFor.BUDGET_EXTENSION
    assert not store.set_goal_status(g.id, "running").waits_for_extension  # kept only while it waits
    assert not store.set_goal_status(g.id, "waiting", "waiting for a budget extension", WaitingFor.APPROVAL) \
        .waits_for_extension  # the kind decides, never the words


def test_stations_are_content_hashed_and_idempotent(store: Store):
    a = store.put_station(_station())
    assert store.put_station(_station()) == a
    b = store.put_station(_station(max_prefill_reqs=2))
    assert b.hash != a.hash
    assert store.get_station(b.hash).knobs["max_prefill_reqs"] == 2


def test_candidate_transitions_are_checked(store: Store):
    g = _goal(store)
    card = {"knob": "max_prefill_reqs", "value": 2, "stage": "screen", "cost_class": "restart", "parent_hash": "p0"}
    c = store.add_candidate(g.id, card)
    assert store.add_candidate(g.id, dict(card)).id == c.id  # same card, same candidate
    assert (c.knob, c.value, c.parent_hash, c.cost_class) == ("max_prefill_reqs", 2, "p0", "restart")
    with pytest.raises(InvalidTransition):
        store.set_candidate_status(c.id, "done")  # proposed -> done skips running
    for s in ("approved", "running", "failed", "running", "done"):
        store.set_candidate_status(c.id, s)
    with pytest.raises(InvalidTransition):
        store.set_candidate_status(c.id, "running")  # done is final
    assert [x.id for x in store.candidates(g.id, status="done")] == [c.id]


def test_approval_binds_the_card_hash(store: Store):
    g = _goal(store)
    c = store.add_candidate(g.id, {"knob": "max_prefill_reqs", "value": 2}, status="awaiting_approval")
    changed = store.update_card(c.id, {"knob": "max_prefill_reqs", "value": 4})
    assert changed.card_hash != c.card_hash
    with pytest.raises(Stale):
        store.approve(c.id, c.card_hash, "alice")  # the card changed after it was shown
    ap = store.approve(c.id, changed.card_hash, "alice", "looks right")
    assert (ap.who, ap.decision, store.get_candidate(c.id).status) == ("alice", "approve", "approved")
    with pytest.raises(Conflict):
        store.approve(c.id, changed.card_hash, "bob")
    with pytest.raises(Conflict):
        store.reject(c.id, changed.card_hash, "bob")
    assert store.approval(c.id) == ap
    with pytest.raises(InvalidTransition):
        store.update_card(c.id, {"knob": "max_prefill_reqs", "value": 8})  # decided cards are frozen


def test_runs_results_and_ledger(store: Store, make_result):
    g = _goal(store)
    r = _run(store, g.id, "r1")
    assert _run(store, g.id, "r1") == r  # idempotent on run_id
    store.set_run_status("r1", "running")
    store.record_result(make_result("r1", verdict="collection_fault"))
    store.record_result(make_result("r1", station_hash="st-1"))  # re-collected: replaces, never double-charges
    assert store.get_result("r1").verdict == "valid"
    assert store.get_run("r1").station_hash == "st-1"  # in the result's transaction: no verdict without its station
    assert len(store.ledger(g.id)) == 2
    assert store.card_hours_used(g.id) == pytest.approx((300 + 120) * 16 / 3600)
    b = store.budget(g.id)
    assert (b.experiments_used, b.experiments_left) == (1, 7)
    assert b.card_hours_left == pytest.approx(24 - (420 * 16 / 3600))
    assert b.affordable(b.card_hours_left) and not b.affordable(b.card_hours_left + 0.01)
    store.set_run_status("r1", "done")
    with pytest.raises(InvalidTransition):
        store.set_run_status("r1", "running")
    assert [x.id for x in store.runs(g.id, status="done")] == ["r1"]


def test_phase_journal_is_fenced_by_the_lease_epoch(store: Store, store_url: str):
    e1 = store.acquire_lease("sim", "exec-a", 60)
    store.record_phase("r1", "lock", "intent", "started", epoch=e1, target="sim")
    store.record_phase("r1", "lock", "outcome", "ok", epoch=e1, target="sim", detail={"rate": float("inf")})
    store.release_lease("sim", "exec-a", e1)
    e2 = store.acquire_lease("sim", "exec-b", 60)
    assert e2 > e1
    with pytest.raises(StaleEpoch) as err:
        store.record_phase("r1", "prepare", "intent", "started", epoch=e1, target="sim")
    assert err.value.current == e2
    with pytest.raises(StaleEpoch):
        store.record_phase("r1", "prepare", "intent", "started", epoch=e2 + 1, target="sim")  # never issued
    store.record_phase("r1", "prepare", "intent", "started", epoch=e2, target="sim", error_class=None)
    again = Store(store_url)  # a restarted process sees every record, in order
    recs = again.phases("r1")
    again.close()
    assert [(p.phase, p.event, p.epoch) for p in recs] == [("lock", "intent", e1), ("lock", "outcome", e1),
                                                          ("prepare", "intent", e2)]
    assert recs[1].detail == {"rate": "inf"} and recs[0].seq < recs[1].seq < recs[2].seq


def test_opening_an_older_database_upgrades_it(store_url: str):
    import sqlalchemy as sa
    from alembic import command

    from state.db import Database
    from state.migrate import alembic_config

    db = Database(store_url)
    with db.engine.connect() as conn:
        command.upgrade(alembic_config(conn), "0001")
        conn.commit()
    with db.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == "0001"
    db.dispose()
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    s = Store(store_url)
    with s._db.read() as sess:
        assert head not in (None, "0001")
        assert sess.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == head
    s.close()


def test_the_kinds_of_reasons_written_before_they_were_columns_are_read_once_from_their_words(store_url: str):
    """Migration 0007: a goal that waited for a budget extension, and instructions refused, done, superseded, keep
    their kinds when an older database is upgraded (the code reads only the columns after that)."""
    import sqlalchemy as sa
    from alembic import command

    from state.db import Database
    from state.migrate import alembic_config

    db = Database(store_url)
    with db.engine.connect() as conn:
        command.upgrade(alembic_config(conn), "0006")
        now = "2026-12-01 00:00:00"
        for gid, reason in (("g1", "waiting for a budget extension of 1.00 card-hours: x"),
                            ("g2", "waiting for approval of candidate 3: y")):
            conn.execute(sa.text("INSERT INTO goals (id, name, spec, spec_hash, status, status_reason, created_at, "
                                 "updated_at) VALUES (:id, 'n', '{}', 'h', 'waiting', :r, :t, :t)"),
                         {"id": gid, "r": reason, "t": now})
        for outcome in ("refused: instruction 1 goes first", "done: the goal paused", "superseded by 9 (stop by d)",
                        None):
            conn.execute(sa.text("INSERT INTO instructions (goal_id, kind, knobs, who, active, created_at, outcome) "
                                 "VALUES ('g1', 'pause', '{}', 'p', :a, :t, :o)"), {"a": False, "t": now, "o": outcome})
        conn.commit()
    db.dispose()
    s = Store(store_url)
    with s._db.read() as sess:
        waits = dict(sess.execute(sa.text("SELECT id, waiting_for FROM goals")).all())
        kinds = [k for (k,) in sess.execute(sa.text("SELECT outcome_kind FROM instructions ORDER BY id"))]
    s.close()
    assert waits == {"g1": "budget_extension", "g2": "approval"}
    assert kinds == ["refused", "done", "superseded", None]


def test_who_gave_an_approval_written_before_it_was_a_column_is_read_once_from_its_words(store_url: str):
    """Migration 0008: approvals the loop gave itself before `given_by` was a column (the authorisation table's
    reason, the --auto-approve approver) keep being counted apart from a person's after an upgrade, and a rejection
    is a person's whatever its words."""
    import sqlalchemy as sa
    from alembic import command

    from state.db import Database
    from state.migrate import alembic_config

    db = Database(store_url)
    now = "2026-12-01 00:00:00"
    with db.engine.connect() as conn:
        command.upgrade(alembic_config(conn), "0007")
        conn.execute(sa.text("INSERT INTO goals (id, name, spec, spec_hash, status, created_at, updated_at) "
                             "VALUES ('g1', 'n', '{}', 'h', 'running', :t, :t)"), {"t": now})
        rows = (("approve", "loop", "authorisation table: hot -> auto"), ("approve", "loop (--auto-approve)", "x"),
                ("reject", "bob (--auto-approve)", "authorisation table: y"), ("approve", "carol (api)", None))
        for i, (decision, who, reason) in enumerate(rows, 1):
            conn.execute(sa.text("INSERT INTO candidates (id, goal_id, card, card_hash, stage, status, created_at, "
                                 "updated_at) VALUES (:i, 'g1', '{}', :h, 'screen', 'approved', :t, :t)"),
                         {"i": i, "h": f"h{i}", "t": now})
            conn.execute(sa.text("INSERT INTO approvals (candidate_id, card_hash, decision, who, reason, created_at) "
                                 "VALUES (:i, :h, :d, :w, :r, :t)"),
                         {"i": i, "h": f"h{i}", "d": decision, "w": who, "r": reason, "t": now})
        conn.commit()
    db.dispose()
    s = Store(store_url)
    try:
        got = [(s.approval(i).given_by, s.approval(i).automatic) for i in range(1, 5)]
        assert got == [("table", True), ("flag", True), ("person", False), ("person", False)]
    finally:
        s.close()


def test_phase_records_are_append_only_in_the_database(store: Store):
    import sqlalchemy as sa

    e = store.acquire_lease("sim", "x", 60)
    store.record_phase("r9", "load", "intent", "started", epoch=e, target="sim")
    for sql in ("UPDATE phase_records SET status = 'ok'", "DELETE FROM phase_records"):
        with pytest.raises(sa.exc.DatabaseError, match="append-only"):
            with store._db.write() as s:  # going around the store on purpose
                s.execute(sa.text(sql))
    assert [p.status for p in store.phases("r9")] == ["started"]


def test_leases_expire_and_epochs_only_grow(store_url: str):
    now = [1000.0]
    s = Store(store_url, clock=lambda: now[0])
    try:
        e1 = s.acquire_lease("t", "a", 10)
        assert s.acquire_lease("t", "b", 10) is None  # a live holder keeps it
        assert s.renew_lease("t", "a", e1, 10)
        now[0] += 11  # a's lease runs out
        e2 = s.acquire_lease("t", "b", 10)
        assert e2 == e1 + 1 and s.current_epoch("t") == e2
        assert not s.renew_lease("t", "a", e1, 10)  # the replaced holder cannot extend
        s.release_lease("t", "a", e1)  # a stale release changes nothing
        assert s.lease("t").holder == "b"
        s.release_lease("t", "b", e2)
        assert s.lease("t").holder is None and s.current_epoch("t") == e2  # release keeps the epoch
        assert s.acquire_lease("t", "a", 10) == e2 + 1
        assert s.current_epoch("other") == 0
    finally:
        s.close()


def test_negatives_remember_their_conditions(store: Store, make_result):
    g = _goal(store)
    _run(store, g.id, "good")
    store.record_result(make_result("good"))
    _run(store, g.id, "bad")
    store.record_result(make_result("bad", verdict="orchestration_fault"))
    cond = Conditions(scenario="copy16k-zero-cache", parent_hash="p1", source_identity="sim@1", data_version="d1")
    with pytest.raises(NotValid):
        store.add_negative("max_num_seqs", 128, cond, goal_id=g.id, run_id="bad")  # a fault is never a negative
    store.add_negative("max_num_seqs", 128, cond, goal_id=g.id, run_id="good", reason="TPOT over the limit")
    same = store.find_negative("max_num_seqs", 128, cond, goal_id=g.id)
    assert same.status == "same" and same.blocks and same.negative.reason == "TPOT over the limit"
    moved = store.find_negative("max_num_seqs", 128, cond.model_copy(update={"parent_hash": "p2", "source_identity": "sim@2"}))
    assert moved.status == "changed" and moved.changed == ("parent_hash", "source_identity") and not moved.blocks
    assert store.find_negative("max_num_seqs", 256, cond).status == "none"
    assert store.find_negative("max_num_seqs", 128, cond.model_copy(update={"scenario": "chat2k"})).status == "none"
    assert store.find_negative("request_rate", float("inf"), cond).status == "none"
    store.add_negative("request_rate", 8, cond, goal_id=g.id, run_id="good")
    assert store.find_negative("request_rate", 8.0, cond).status == "same"  # 8 and 8.0 are one value
    assert [n.value for n in store.negatives(goal_id=g.id)] == [128, 8.0]


def test_instructions_with_a_count(store: Store):
    g = _goal(store)
    assert store.current_instruction(g.id) is None and instruction_effect(None) == "run"
    store.add_instruction(g.id, "pause", "alice")
    assert instruction_effect(store.current_instruction(g.id)) == "pause"
    i = store.add_instruction(g.id, "one_more_round", "bob", count=2, knobs={"concurrency": 90}, text="one more at C90")
    assert (i.remaining, i.knobs, i.who) == (2, {"concurrency": 90}, "bob")
    assert instruction_effect(store.consume_round(g.id)) == "run"
    assert store.consume_round(g.id).remaining == 0
    assert instruction_effect(store.current_instruction(g.id)) == "stop"  # exactly two rounds, then stop
    assert [x.active for x in store.instructions(g.id)] == [False, True]
    with pytest.raises(ValueError, match="count"):
        store.add_instruction(g.id, "one_more_round", "bob", count=0)
    with pytest.raises(ValueError, match="knobs.concurrency"):
        store.add_instruction(g.id, "one_more_round", "bob", knobs={"concurrency": -1})


def test_no_instruction_is_dropped_a_restore_waits_its_turn_and_what_is_replaced_says_by_what(store: Store):
    g = _goal(store)
    restore = store.add_instruction(g.id, "restore", "alice", text="go back to the best")
    pause = store.add_instruction(g.id, "pause", "bob")
    # the restore was given first: it is what the loop acts on next, and the pause did not cancel it
    assert store.current_instruction(g.id).id == restore.id
    store.close_instruction(restore.id, OutcomeKind.DONE, "went back to station abc")
    assert store.current_instruction(g.id).id == pause.id  # then the pause holds
    store.settle_instruction(pause.id, OutcomeKind.DONE, "the goal paused")
    rounds = store.add_instruction(g.id, "one_more_round", "carol", count=3)
    store.consume_round(g.id)
    store.add_instruction(g.id, "stop", "dave")
    later = store.add_instruction(g.id, "restore", "erin")
    frank = store.add_instruction(g.id, "restore", "frank")  # erin's still waits: refused, never a silent replace
    assert not frank.active and frank.outcome == (f"refused: instruction {later.id} by erin (go back to the best station, "
                                                  "still waiting) is not finished; it goes first and this one changes "
                                                  "nothing")
    got = {i.id: i for i in store.instructions(g.id)}
    assert got[restore.id].outcome == "done: went back to station abc" and not got[restore.id].active
    assert got[pause.id].outcome == "done: the goal paused"  # carried out, then replaced: its outcome stands
    assert got[rounds.id].outcome == "superseded by %d (stop by dave) after 1 of 3 round(s)" % (rounds.id + 1)
    # the kinds the code branches on, beside the words people read
    assert frank.outcome_kind is OutcomeKind.REFUSED and got[restore.id].outcome_kind is OutcomeKind.DONE
    assert got[rounds.id].outcome_kind is OutcomeKind.SUPERSEDED and got[rounds.id].superseded_by == rounds.id + 1
    assert got[later.id].outcome_kind is None and got[later.id].superseded_by is None
    assert got[later.id].outcome is None and got[later.id].active  # erin's is what the loop carries out next
    assert store.current_instruction(g.id).id == later.id
    assert all(i.outcome_at is not None for i in got.values() if i.outcome)
    store.settle_instruction(pause.id, OutcomeKind.DONE, "something else")  # an outcome is set once
    assert store.instructions(g.id)[1].outcome == "done: the goal paused"


def test_best_and_frontier_never_take_a_quality_pending_station(store: Store, make_result):
    g = _goal(store)
    base, fast, c90 = (store.put_station(_station(max_prefill_reqs=v)) for v in (1, 2, 3))
    store.record_decision(g.id, "baseline", run_id="r0", station_hash=base.hash)
    store.record_decision(g.id, "new_best", run_id="r1", station_hash=fast.hash, changed=True)
    store.record_decision(g.id, "quality_pending", run_id="r2", station_hash=c90.hash, changed=True)
    assert store.best_station(g.id).hash == fast.hash
    store.record_decision(g.id, "tradeoff", run_id="r3", station_hash=c90.hash, changed=True)
    assert {d.station_hash for d in store.frontier(g.id)} == {base.hash, fast.hash, c90.hash}
    assert store.best_station(g.id).hash == fast.hash
    with pytest.raises(ValueError, match="kind"):
        store.record_decision(g.id, "bestest")


def test_a_reference_run_after_a_new_best_makes_nothing_best(store: Store):
    """A reference of the best station at the screen N (for the next screens), or of a parent before a
    confirm, is not the decision that made the best: the new best stays (with its own run and figures)."""
    g = _goal(store)
    base, fast = (store.put_station(_station(max_prefill_reqs=v)) for v in (1, 2))
    store.record_decision(g.id, "baseline", run_id="r0", station_hash=base.hash)
    assert store.best(g.id).run_id == "r0"  # nothing beat the start yet: its reference is the best
    store.record_decision(g.id, "baseline", run_id="r0b", station_hash=base.hash)
    assert store.best(g.id).run_id == "r0b"
    store.record_decision(g.id, "new_best", run_id="r1", station_hash=fast.hash, changed=True,
                          data={"knobs": {"max_prefill_reqs": 2}})
    store.record_decision(g.id, "baseline", run_id="r2", station_hash=fast.hash, data={"knobs": {"max_prefill_reqs": 2}})
    store.record_decision(g.id, "baseline", run_id="r3", station_hash=base.hash, data={"knobs": {"max_prefill_reqs": 1}})
    assert store.best(g.id).run_id == "r1" and store.best_station(g.id).hash == fast.hash
    from agent.loop.record import build_history  # the planner reads the same rule: the parent's reference moves nothing

    assert build_history(store, g.id).best_knobs == {"max_prefill_reqs": 2}


def test_frontier_keeps_different_n_side_by_side(store: Store):
    g = _goal(store)
    st = store.put_station(_station())
    _run(store, g.id, "screen", n=320)
    _run(store, g.id, "confirm", n=640)
    _run(store, g.id, "confirm-again", n=640)
    for rid in ("screen", "confirm", "confirm-again"):
        store.record_decision(g.id, "baseline", run_id=rid, station_hash=st.hash)
    assert sorted(d.run_id for d in store.frontier(g.id)) == ["confirm-again", "screen"]

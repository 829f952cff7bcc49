"""Authority over a running goal (a real `tuneloop serve`, CLI processes): budget extensions asked, granted and
refused by REST, chat and the CLI; a CLI approval reaching the service; two goals, two STATE.md files; a deny
remembered; an approval used after the deadline asked again; pause, resume and stop; the store's side."""
from __future__ import annotations

import time

import httpx
import pytest
from steering_support import (QueueStore, ServerProcess, auth, awaiting, change, get, post, say,  # noqa: F401
                              served, service_env, small_goal, tuneloop, wait_until)  # (served: a fixture)


def extension_goal(name: str) -> dict:
    """A budget the promising screen's confirm does not fit in (the simulator is deterministic)."""
    g = small_goal(name, ask=False, experiments=8)
    g["budget"] = {"card_hours": 7.45, "experiments": 8}
    return g


@pytest.fixture
def served_rules(tmp_path):
    """`tuneloop serve` planning with the evidence rules alone (TUNELOOP_TWIN=off): the extension below is asked for
    the confirm of a promising screen, which the rules' path screens first; the goal's twin (on by default) jumps
    straight to confirm N, so no screen's confirm crosses the budget."""
    db = f"sqlite:///{tmp_path / 't.db'}"
    srv = ServerProcess(tmp_path, service_env(tmp_path, db, TUNELOOP_POLL_S="0.5", TUNELOOP_TWIN="off"))
    srv.db = db  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.stop()


def test_budget_extension_is_asked_granted_by_rest_chat_cli_and_a_refusal_stops_the_goal(served_rules, tmp_path):
    srv = served_rules
    gids = {how: post(srv, "/goals", extension_goal(f"ext-{how}"), role="admin", code=201).json()["id"]
            for how in ("rest", "chat", "cli", "refuse")}
    asked = {}
    for how, gid in gids.items():
        asked[how] = wait_until(lambda: get(srv, f"/goals/{gid}/budget/extensions")["asked"],
                                what=f"the {how} goal to ask for an extension")
        assert get(srv, f"/goals/{gid}")["status"] == "waiting"
        assert asked[how]["card_hours"] > 0 and "needs a budget extension" in asked[how]["why"]
    cid = {how: a["candidate_id"] for how, a in asked.items()}
    assert all(get(srv, f"/candidates/{c}")["card"]["stage"] == "confirm" for c in cid.values())  # of a gain
    post(srv, f"/goals/{gids['rest']}/budget/extensions", {"card_hours": 10, "reason": "worth confirming"}, code=201)
    assert "extended by 10 card-hours" in say(srv, gids["chat"], "预算增加 10 卡时")["reply"]
    out = tuneloop(tmp_path, "budget", "extend", gids["cli"], "--card-hours", "10", "--db", srv.db, "--who", "dora")
    assert out.returncode == 0, out.stderr
    reply = say(srv, gids["refuse"], "refuse the extension because the quarter's cards are spent")["reply"]
    assert "refused" in reply
    for how in ("rest", "chat", "cli"):
        gid = gids[how]
        wait_until(lambda: any(e["candidate_id"] == cid[how] and e["verdict"] == "valid"
                               for e in get(srv, f"/goals/{gid}/experiments")), what=f"the {how}-granted confirm to run")
        b = get(srv, f"/goals/{gid}/budget")
        assert b["card_hours_limit"] == pytest.approx(17.45)
    g = wait_until(lambda: (x := get(srv, f"/goals/{gids['refuse']}"))["status"] == "stopped" and x,
                   what="the refused goal to stop")
    assert "budget extension refused by approver1 (chat): the quarter's cards are spent" in g["status_reason"]
    assert not [e for e in get(srv, f"/goals/{gids['refuse']}/experiments") if e["candidate_id"] == cid["refuse"]]
    exts = get(srv, f"/goals/{gids['cli']}/budget/extensions")["extensions"]
    assert [(x["decision"], x["card_hours"], x["who"]) for x in exts] == [("grant", 10.0, "dora (cli)")]
    r = post(srv, f"/goals/{gids['refuse']}/budget/extensions/refuse", {"reason": "late"})
    assert r.status_code == 409  # it waits for no extension now


def test_cli_approval_reaches_a_running_serve_without_a_resume_and_chat_binds_the_shown_hash(served, tmp_path):
    srv = served
    gid = post(srv, "/goals", small_goal("cli-approve", experiments=3), role="admin", code=201).json()["id"]
    card = wait_until(lambda: awaiting(srv, gid), what="a card awaiting approval")[0]
    wait_until(lambda: get(srv, f"/goals/{gid}")["worker_state"] == "idle", what="the waiting goal to be given back")
    t0 = time.monotonic()
    out = tuneloop(tmp_path, "approve", str(card["id"]), "--db", srv.db, "--who", "erin")
    assert out.returncode == 0, out.stderr
    t1 = time.monotonic()
    run = wait_until(lambda: [e for e in get(srv, f"/goals/{gid}/experiments") if e["candidate_id"] == card["id"]],
                     what="the CLI-approved card to start")
    print(f"CLI approval -> run started in the service: {time.monotonic() - t0:.2f} s from the CLI's start, "
          f"{time.monotonic() - t1:.2f} s after it exited")
    assert run and get(srv, f"/goals/{gid}/instructions") == []  # nobody said "resume"

    # chat approval is bound to the hash the loop showed: a card edited since is refused, not approved
    nxt = wait_until(lambda: awaiting(srv, gid, {card["id"]}), what="the next card")[0]
    st = QueueStore(srv.db)
    try:
        st.update_card(nxt["id"], {**nxt["card"], "note": "edited after it was shown"})
    finally:
        st.close()
    r = post(srv, f"/goals/{gid}/chat", {"text": f"approve {nxt['id']}"})
    assert r.status_code == 409 and "changed since it was shown" in r.text
    assert httpx.get(f"{srv.url}/candidates/{nxt['id']}/approval", headers=auth("viewer")).json() is None


def test_two_goals_in_one_serve_write_two_state_files_and_ids_keep_their_names(served, tmp_path):
    srv = served
    a = post(srv, "/goals", small_goal("j16k-ask", ask=False, experiments=1), role="admin", code=201).json()["id"]
    b = post(srv, "/goals", small_goal("other-goal", ask=False, experiments=1), role="admin", code=201).json()["id"]
    for gid in (a, b):
        wait_until(lambda: get(srv, f"/goals/{gid}")["status"] == "done", what=f"{gid} to finish")
    texts = {gid: (tmp_path / "runs" / gid / "STATE.md").read_text() for gid in (a, b)}
    assert a.startswith("j16k-ask-")
    for gid, other in ((a, b), (b, a)):
        assert texts[gid].startswith(f"# tuneloop state: goal {gid} (")
        assert other not in texts[gid] and "- status: done" in texts[gid]
        assert "[redacted]" not in texts[gid]
    assert get(srv, f"/goals/{a}/experiments")[0]["id"] in texts[a]


def test_a_deny_of_the_authorisation_table_is_remembered_and_the_run_ends(tmp_path):
    """`restart: deny`: every restart card is denied once, remembered, never proposed again; the `tuneloop run`
    process ends by itself (it used to re-propose the denied card forever)."""
    import yaml

    # five experiments: the two references, the hot rate move's screen and confirm (the planner's first hot
    # move on the warm start), then the restart card, which the table denies
    g = small_goal("deny-restart", ask=False, experiments=5)
    g["authorisation"]["restart"] = "deny"
    goal = tmp_path / "goal.yaml"
    goal.write_text(yaml.safe_dump(g))
    db = f"sqlite:///{tmp_path / 't.db'}"
    out = tuneloop(tmp_path, "run", str(goal), "--db", db, "--auto-approve")
    assert out.returncode == 0, out.stderr
    st = QueueStore(db)
    try:
        gid = st.goals()[0].id
        vetoes = st.vetoes(gid)
        assert vetoes and all(v.source == "authorisation" and v.who == "authorisation table" for v in vetoes)
        # a card's changes together (the twin's jump, on by default, then a pair of its changes, then one of them
        # alone are three restart cards, each denied once)
        keys = [(v.parent_hash, change({"card": st.get_candidate(v.candidate_id).card})) for v in vetoes]
        assert len(keys) == len(set(keys))  # each denied card was proposed once
        ran = [st.get_candidate(r.candidate_id).card for r in st.runs(gid)]
        assert ran and all(c["cost_class"] == "hot" for c in ran)  # nothing denied ran
        assert st.get_goal(gid).status in ("done", "stopped")
    finally:
        st.close()


def test_an_approval_given_before_the_deadline_and_used_after_it_is_asked_again(tmp_path):
    import datetime as dt

    import yaml

    # the first `tuneloop run` must reach its first ask before the deadline: 45 s was too short once on a CI machine
    # at a load average of 20-30 (the process's start-up and the baseline's card); waiting it out costs no CPU
    deadline = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=90)
    g = small_goal("deadline-goal", experiments=4)
    g["budget"]["deadline"] = deadline.isoformat()
    goal = tmp_path / "goal.yaml"
    goal.write_text(yaml.safe_dump(g))
    db = f"sqlite:///{tmp_path / 't.db'}"
    out = tuneloop(tmp_path, "run", str(goal), "--db", db)
    assert "waiting: approve candidate" in out.stdout, out.stdout + out.stderr
    c1 = int(out.stdout.split("waiting: approve candidate ", 1)[1].split()[0])
    assert tuneloop(tmp_path, "approve", str(c1), "--db", db, "--who", "fred").returncode == 0
    st = QueueStore(db)
    try:
        assert st.approval(c1).context["deadline_passed"] is False, "the approval came after the deadline: too slow"
    finally:
        st.close()
    wait_until(lambda: dt.datetime.now(dt.timezone.utc) > deadline, timeout=180, what="the deadline to pass")
    out = tuneloop(tmp_path, "run", str(goal), "--db", db)
    assert "waiting: approve candidate" in out.stdout, out.stdout + out.stderr
    c2 = int(out.stdout.split("waiting: approve candidate ", 1)[1].split()[0])
    st = QueueStore(db)
    try:
        gid = st.goals()[0].id
        assert c2 != c1 and st.runs(gid) == []  # asked again, nothing ran on the old approval
        old, new = st.get_candidate(c1), st.get_candidate(c2)
        assert old.status == "cancelled" and "deadline" in old.status_reason
        assert new.card["experiment_key"] == old.card["experiment_key"] and "asked again" in new.card["note"]
        assert "the deadline has passed" in st.get_goal(gid).status_reason
    finally:
        st.close()
    assert tuneloop(tmp_path, "approve", str(c2), "--db", db, "--who", "fred").returncode == 0
    out = tuneloop(tmp_path, "run", str(goal), "--db", db)
    st = QueueStore(db)
    try:
        assert [r.candidate_id for r in st.runs(gid)][:1] == [c2]  # approved after the deadline: it runs
    finally:
        st.close()


def test_pause_resume_and_stop_by_chat_and_rest_do_what_they_say(served, tmp_path):
    """Each does what it says, after the decision a person owes (issue 44): a pause or stop given while a card
    waits leaves that card to the person, then takes effect; the answer says it is queued."""
    srv = served
    gid = post(srv, "/goals", small_goal("pause-goal", experiments=4), role="admin", code=201).json()["id"]
    ref = wait_until(lambda: awaiting(srv, gid), what="the reference card")[0]
    out = say(srv, gid, "暂停")
    assert out["action"]["instruction"] and f"queued: candidate {ref['id']} waits" in out["reply"]
    wait_until(lambda: get(srv, f"/goals/{gid}")["worker_state"] == "idle", what="the woken goal to be given back")
    assert get(srv, f"/goals/{gid}")["status"] == "waiting"  # the person's card is not paused over
    post(srv, f"/candidates/{ref['id']}/approve", {"card_hash": ref["card_hash"]}, code=200)
    g = wait_until(lambda: (x := get(srv, f"/goals/{gid}"))["status"] == "paused" and x, what="the pause")
    assert "paused by approver1" in g["status_reason"] and get(srv, f"/goals/{gid}/experiments") == []
    post(srv, f"/goals/{gid}/resume", code=200)  # the approved reference runs, then the next card asks
    nxt = wait_until(lambda: awaiting(srv, gid, {ref["id"]}), what="the next card after the reference ran")[0]
    assert [e["candidate_id"] for e in get(srv, f"/goals/{gid}/experiments")] == [ref["id"]]
    r = post(srv, f"/goals/{gid}/stop", code=200)  # REST stop: queued behind the card, then chat rejects it
    assert f"queued: candidate {nxt['id']} waits" in r.json()["note"]
    assert say(srv, gid, f"reject {nxt['id']} because stopping anyway")["action"]["decision"] == "reject"
    g = wait_until(lambda: (x := get(srv, f"/goals/{gid}"))["status"] == "stopped" and x, what="the stop")
    assert "stopped by approver1" in g["status_reason"]
    assert say(srv, gid, "resume")["action"]["instruction"]  # chat resume of a stopped goal
    again = wait_until(lambda: awaiting(srv, gid, {ref["id"], nxt["id"]}), what="the resumed goal")[0]
    assert say(srv, gid, "停止")["action"]["instruction"]
    post(srv, f"/candidates/{again['id']}/reject", {"card_hash": again["card_hash"], "reason": "done for today"},
         code=200)
    wait_until(lambda: get(srv, f"/goals/{gid}")["status"] == "stopped" and get(srv, f"/goals/{gid}")["worker_state"]
               == "idle", what="the chat stop")
    assert [e["candidate_id"] for e in get(srv, f"/goals/{gid}/experiments")] == [ref["id"]]  # only the approved ran
    outcomes = [i["outcome"] for i in get(srv, f"/goals/{gid}/instructions")]
    assert all(outcomes[:-1]) and outcomes[-1] == "done: the goal stopped"  # every one kept its outcome


def test_store_vetoes_extensions_and_waiting_checks_on_both_backends(store):
    from state.errors import Conflict
    from state.goal import parse_goal
    from state.snapshots import Conditions

    g = store.create_goal(parse_goal(small_goal("store-steer")))
    c = store.add_candidate(g.id, {"stage": "screen", "n": 40, "change": {"knob": "concurrency", "old": 128, "new": 90}})
    with pytest.raises(Conflict, match="not waiting"):
        store.check_waiting(c.id)
    store.set_goal_status(g.id, "waiting", f"waiting for approval of candidate {c.id}")
    assert store.check_waiting(c.id).id == c.id
    store.reject(c.id, c.card_hash, "ann", "no")
    with pytest.raises(Conflict, match="already rejected by ann"):
        store.check_waiting(c.id)
    assert store.approval(c.id).context == {"deadline_passed": False, "card_hours_left": 24.0, "experiments_left": 2}
    cond = Conditions(scenario="copy16k-zero-cache", parent_hash="p" * 16, source_identity="sim", data_version="d1")
    v = store.add_veto(g.id, "concurrency", 90, cond, who="ann", reason="no", candidate_id=c.id)
    assert store.add_veto(g.id, "concurrency", 90, cond, who="ann", reason="no", candidate_id=c.id).id == v.id
    store.add_veto(g.id, None, None, cond, who="authorisation table", reason="deny", source="authorisation")
    assert [(x.knob, x.value, x.source) for x in store.vetoes(g.id)] == [("concurrency", 90, "person"),
                                                                          (None, None, "authorisation")]
    store.extend_budget(g.id, 10, 1, "bob", "worth it")
    store.refuse_extension(g.id, "cy", "enough")
    b = store.budget(g.id)
    assert (b.card_hours_limit, b.experiments_limit, b.extended_card_hours) == (34.0, 3, 10.0)
    assert [x.decision for x in store.extensions(g.id)] == ["grant", "refuse"]
    for bad, field in (((-1, 0), "card_hours"), ((0, 0), "card_hours"), ((1, -2), "experiments"), ((1, 1.5), "experiments")):
        with pytest.raises(ValueError, match=field):
            store.extend_budget(g.id, *bad, "bob")

"""A person steers a running `tuneloop serve` (a real uvicorn process) through REST, chat and the CLI (real
processes): a rejection is a veto the loop never proposes again and moves on from, waiting costs no CPU,
"one more round at C90" runs exactly that, a budget-crossing confirm asks for an extension that REST, chat
and the CLI grant or refuse, a CLI approval reaches the service without a resume, one STATE.md per goal."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from test_api_support import ROOT, ServerProcess, auth, service_env, small_goal, wait_until

from state.workqueue import QueueStore

WAIT_WINDOW_S = 30.0  # the window of waiting for a person
MAX_CPU_SHARE = 0.05


@pytest.fixture
def served(tmp_path):
    db = f"sqlite:///{tmp_path / 't.db'}"
    srv = ServerProcess(tmp_path, service_env(tmp_path, db, TUNELOOP_POLL_S="0.5"))
    srv.db = db  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.stop()


def get(srv, path: str, role: str = "viewer"):
    r = httpx.get(srv.url + path, headers=auth(role), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def post(srv, path: str, body: dict | None = None, role: str = "approver", code: int | None = None):
    r = httpx.post(srv.url + path, json=body, headers=auth(role), timeout=30)
    if code is not None:
        assert r.status_code == code, r.text
    return r


def say(srv, gid: str, text: str) -> dict:
    return post(srv, f"/goals/{gid}/chat", {"text": text}, code=200).json()


def awaiting(srv, gid: str, not_in: set[int] = frozenset()) -> list[dict]:
    return [c for c in get(srv, f"/goals/{gid}/candidates?awaiting=true") if c["id"] not in not_in]


def tuneloop(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")} | {"PYTHONPATH": str(ROOT),
                                                                                     "TUNELOOP_RUNS_ROOT": str(tmp / "runs")}
    return subprocess.run([sys.executable, "-m", "tuneloop_cli", *args], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=600)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of a process and its live children (`tuneloop serve`'s API and worker
    processes), from /proc."""
    total = 0
    for p in Path("/proc").iterdir():
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split() if p.name.isdigit() else None
        except OSError:
            continue
        if fields and (int(p.name) == pid or int(fields[1]) == pid):
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def change(card: dict) -> tuple:
    ch = card["card"]["change"]
    return (card["card"]["parent_knobs_hash"], ch["knob"] if ch else None, ch["new"] if ch else None, card["card"]["stage"])


def test_rejections_by_rest_chat_and_cli_are_vetoes_the_loop_moves_on_and_waits_without_cpu(served, tmp_path):
    srv = served
    gid = post(srv, "/goals", small_goal("veto-goal", experiments=3), role="admin", code=201).json()["id"]
    ref = wait_until(lambda: awaiting(srv, gid), what="the reference card")[0]
    post(srv, f"/candidates/{ref['id']}/approve", {"card_hash": ref["card_hash"]}, code=200)
    seen = {ref["id"]}
    rejected = []
    ways = [("rest", "the prefill side is not ours to change"), ("chat-en", "TPOT is too close to the limit"),
            ("chat-zh", "这个改动风险太大"), ("cli", "not during business hours")]
    for how, reason in ways:
        card = wait_until(lambda: awaiting(srv, gid, seen), what=f"the next card (before the {how} rejection)")[0]
        seen.add(card["id"])
        assert change(card) not in {change(c) for c in rejected}  # never proposed again under the same conditions
        if how == "rest":
            post(srv, f"/candidates/{card['id']}/reject", {"card_hash": card["card_hash"], "reason": reason}, code=200)
        elif how == "chat-en":
            assert say(srv, gid, f"reject {card['id']} because {reason}")["action"]["decision"] == "reject"
        elif how == "chat-zh":
            assert say(srv, gid, f"拒绝 {card['id']} 因为 {reason}")["action"]["decision"] == "reject"
        else:  # the CLI writes the store and wakes the goal: the running service picks it up, no resume needed
            out = tuneloop(tmp_path, "approve", str(card["id"]), "--reject", "--reason", reason, "--db", srv.db,
                           "--who", "carol")
            assert out.returncode == 0, out.stderr
        rejected.append(card)
    nxt = wait_until(lambda: awaiting(srv, gid, seen), what="a fifth card after four rejections")[0]
    assert change(nxt) not in {change(c) for c in rejected}

    # the decision log shows each veto with who and why; nothing rejected ran
    log = get(srv, f"/goals/{gid}/decisions")
    vetoes = [d for d in log if d["kind"] == "rejected"]
    assert [d["candidate_id"] for d in vetoes] == [c["id"] for c in rejected]
    assert [d["data"]["reason"] for d in vetoes] == [r for _, r in ways]
    assert [d["data"]["who"] for d in vetoes] == ["approver1 (api)", "approver1 (chat)", "approver1 (chat)", "carol"]
    assert all(d["data"]["source"] == "person" and "not a measurement" in d["text"] for d in vetoes)
    ran = {e["candidate_id"] for e in get(srv, f"/goals/{gid}/experiments")}
    assert ran == {ref["id"]}
    why = say(srv, gid, f"why was {rejected[2]['id']} rejected?")["reply"]
    assert "这个改动风险太大" in why
    assert not [d for d in log if d["kind"] == "negative"]  # a veto is not a measurement
    state_md = (tmp_path / "runs" / gid / "STATE.md").read_text()
    assert state_md.count("- vetoed: ") == 4 and "rejected by carol: not during business hours" in state_md

    # a decision on a card the goal is not waiting for: 409
    r = post(srv, f"/candidates/{ref['id']}/approve", {"card_hash": ref["card_hash"]})
    assert r.status_code == 409

    # waiting for a person: no new decisions, and the service process stays under 5 % CPU over the window
    wait_until(lambda: get(srv, f"/goals/{gid}")["worker_state"] == "idle", what="the goal to be given back")
    before = len(get(srv, f"/goals/{gid}/decisions"))
    cpu0, t0 = cpu_seconds(srv.proc.pid), time.monotonic()
    time.sleep(WAIT_WINDOW_S)  # the window itself, not an assertion on how long anything took
    cpu1, t1 = cpu_seconds(srv.proc.pid), time.monotonic()
    assert len(get(srv, f"/goals/{gid}/decisions")) == before
    share = (cpu1 - cpu0) / (t1 - t0)
    print(f"serve CPU while waiting: {cpu1 - cpu0:.2f} s over {t1 - t0:.1f} s = {share:.1%}")
    assert share < MAX_CPU_SHARE, f"{share:.1%} CPU while waiting for a person"


def test_rejecting_everything_ends_with_nothing_left_that_was_not_rejected(tmp_path):
    """With a one-knob space the loop runs out of cards a person did not reject and says so (a `tuneloop run`
    process and the CLI; a deny of the authorisation table ends the same way)."""
    import yaml

    g = small_goal("all-vetoed", experiments=4)
    g["search_space"] = {"concurrency": [90, 128, 160]}
    goal = tmp_path / "goal.yaml"
    goal.write_text(yaml.safe_dump(g))
    db = f"sqlite:///{tmp_path / 't.db'}"
    out = tuneloop(tmp_path, "run", str(goal), "--db", db)
    first = QueueStore(db)
    try:
        [c] = first.candidates(first.goals()[0].id)
    finally:
        first.close()
    assert tuneloop(tmp_path, "approve", str(c.id), "--db", db).returncode == 0
    texts = []
    for _ in range(6):
        out = tuneloop(tmp_path, "run", str(goal), "--db", db)
        texts.append(out.stdout)
        if "waiting: approve candidate" not in out.stdout:
            break
        cid = out.stdout.split("waiting: approve candidate ", 1)[1].split()[0]
        r = tuneloop(tmp_path, "approve", cid, "--reject", "--reason", "no concurrency changes today", "--db", db)
        assert r.returncode == 0, r.stderr
    assert "nothing left that was not rejected" in texts[-1], texts
    st = QueueStore(db)
    try:
        gid = st.goals()[0].id
        assert st.get_goal(gid).status == "done"
        assert len(st.runs(gid)) == 1  # only the reference ran
        assert {(v.knob, v.value) for v in st.vetoes(gid)} >= {("concurrency", 90), ("concurrency", 160)}
    finally:
        st.close()


def test_one_more_round_at_c90_on_a_waiting_goal_by_chat_and_on_a_finished_goal_by_rest(served, tmp_path):
    srv = served
    # a goal waiting for approval of its next card: the instruction replaces that card, runs C90 once, stops
    gid = post(srv, "/goals", small_goal("c90-running", experiments=6), role="admin", code=201).json()["id"]
    ref = wait_until(lambda: awaiting(srv, gid), what="the reference card")[0]
    post(srv, f"/candidates/{ref['id']}/approve", {"card_hash": ref["card_hash"]}, code=200)
    pending = wait_until(lambda: awaiting(srv, gid, {ref["id"]}), what="a second card")[0]
    best = get(srv, f"/goals/{gid}/best")
    out = say(srv, gid, "one more round at C90")
    assert "concurrency=90" in out["reply"]
    g = wait_until(lambda: (x := get(srv, f"/goals/{gid}"))["status"] == "stopped" and x, what="the round to end")
    assert "instruction fulfilled: 1 more round(s) ran" in g["status_reason"]
    runs = get(srv, f"/goals/{gid}/experiments")
    assert len(runs) == 2 and runs[0]["candidate_id"] == ref["id"]
    card = get(srv, f"/candidates/{runs[1]['candidate_id']}")["card"]
    assert card["change"] == {"knob": "concurrency", "old": 128, "new": 90} and card["stage"] == "screen"
    assert all(best["knobs"].get(k) == v for k, v in card["parent_knobs"].items())  # from the best station
    assert get(srv, f"/candidates/{pending['id']}")["status"] == "cancelled"  # superseded, never run

    # a finished goal (its budget spent): the instruction reopens it for exactly that round
    gid = post(srv, "/goals", small_goal("c90-done", ask=False, experiments=2), role="admin", code=201).json()["id"]
    wait_until(lambda: get(srv, f"/goals/{gid}")["status"] == "done", what="the goal to finish")
    done_runs = get(srv, f"/goals/{gid}/experiments")
    post(srv, f"/goals/{gid}/instructions", {"kind": "one_more_round", "count": 1, "knobs": {"concurrency": 90}}, code=201)
    g = wait_until(lambda: (x := get(srv, f"/goals/{gid}"))["status"] == "stopped" and x, what="the reopened round")
    assert "instruction fulfilled" in g["status_reason"]
    runs = get(srv, f"/goals/{gid}/experiments")
    assert len(runs) == len(done_runs) + 1
    card = get(srv, f"/candidates/{runs[-1]['candidate_id']}")["card"]
    assert card["change"]["knob"] == "concurrency" and card["change"]["new"] == 90 and card["planner"] == "instruction"
    assert runs[-1]["verdict"] == "valid"

    # the CLI, while serve runs: the same round on that (now stopped) goal, at C=64 this time
    out = tuneloop(tmp_path, "instruct", gid, "one_more_round", "--knob", "concurrency=64", "--db", srv.db, "--who", "gil")
    assert out.returncode == 0, out.stderr
    wait_until(lambda: len(get(srv, f"/goals/{gid}/experiments")) == len(runs) + 1, what="the CLI-instructed round")
    g = wait_until(lambda: (x := get(srv, f"/goals/{gid}"))["status"] == "stopped" and "fulfilled" in x["status_reason"]
                   and x["worker_state"] == "idle" and x, what="the CLI round to end")
    last = get(srv, f"/goals/{gid}/experiments")
    assert len(last) == len(runs) + 1
    card = get(srv, f"/candidates/{last[-1]['candidate_id']}")["card"]
    assert card["change"]["new"] == 64 and card["note"].startswith("instruction") and "by gil" in card["note"]


def extension_goal(name: str) -> dict:
    """A budget the promising screen's confirm does not fit in (the simulator is deterministic)."""
    g = small_goal(name, ask=False, experiments=8)
    g["budget"] = {"card_hours": 7.45, "experiments": 8}
    return g


def test_budget_extension_is_asked_granted_by_rest_chat_cli_and_a_refusal_stops_the_goal(served, tmp_path):
    srv = served
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

    g = small_goal("deny-restart", ask=False, experiments=4)
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
        keys = [(v.knob, v.value, v.parent_hash) for v in vetoes]
        assert len(keys) == len(set(keys))  # each denied change was proposed once
        ran = [st.get_candidate(r.candidate_id).card for r in st.runs(gid)]
        assert ran and all(c["cost_class"] == "hot" for c in ran)  # nothing denied ran
        assert st.get_goal(gid).status in ("done", "stopped")
    finally:
        st.close()


def test_an_approval_given_before_the_deadline_and_used_after_it_is_asked_again(tmp_path):
    import datetime as dt

    import yaml

    deadline = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=45)
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
    wait_until(lambda: dt.datetime.now(dt.timezone.utc) > deadline, timeout=120, what="the deadline to pass")
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
    srv = served
    gid = post(srv, "/goals", small_goal("pause-goal", experiments=4), role="admin", code=201).json()["id"]
    ref = wait_until(lambda: awaiting(srv, gid), what="the reference card")[0]
    assert say(srv, gid, "暂停")["action"]["instruction"]
    g = wait_until(lambda: (x := get(srv, f"/goals/{gid}"))["status"] == "paused" and x, what="the pause")
    assert "paused by approver1" in g["status_reason"] and get(srv, f"/goals/{gid}/experiments") == []
    r = post(srv, f"/candidates/{ref['id']}/approve", {"card_hash": ref["card_hash"]})
    assert r.status_code == 409  # a paused goal waits for no card
    post(srv, f"/goals/{gid}/resume", code=200)
    again = wait_until(lambda: awaiting(srv, gid), what="the resumed loop to ask again")[0]
    assert again["id"] == ref["id"] and get(srv, f"/goals/{gid}/experiments") == []  # nothing ran while paused
    post(srv, f"/candidates/{ref['id']}/approve", {"card_hash": ref["card_hash"]}, code=200)
    nxt = wait_until(lambda: awaiting(srv, gid, {ref["id"]}), what="the next card after the reference ran")[0]
    assert [e["candidate_id"] for e in get(srv, f"/goals/{gid}/experiments")] == [ref["id"]]
    post(srv, f"/goals/{gid}/pause", code=200)  # REST pause, chat resume
    wait_until(lambda: get(srv, f"/goals/{gid}")["status"] == "paused", what="the REST pause")
    assert say(srv, gid, "resume")["action"]["instruction"]
    assert wait_until(lambda: awaiting(srv, gid), what="the chat resume")[0]["id"] == nxt["id"]
    assert say(srv, gid, "停止")["action"]["instruction"]
    g = wait_until(lambda: (x := get(srv, f"/goals/{gid}"))["status"] == "stopped" and x, what="the chat stop")
    assert "stopped by approver1" in g["status_reason"]
    post(srv, f"/goals/{gid}/resume", code=200)
    wait_until(lambda: awaiting(srv, gid), what="the resumed goal")
    post(srv, f"/goals/{gid}/stop", code=200)  # REST stop
    wait_until(lambda: get(srv, f"/goals/{gid}")["status"] == "stopped", what="the REST stop")
    assert [e["candidate_id"] for e in get(srv, f"/goals/{gid}/experiments")] == [ref["id"]]  # only the approved ran


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

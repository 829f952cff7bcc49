"""A person steers a running `tuneloop serve` (a real uvicorn process) through REST, chat and the CLI (real
processes): a rejection is a veto the loop never proposes again and moves on from, waiting costs no CPU,
"one more round at C90" runs exactly that, a budget-crossing confirm asks for an extension that REST, chat
and the CLI grant or refuse, a CLI approval reaches the service without a resume, one STATE.md per goal."""
from __future__ import annotations

import time

from steering_support import (MAX_CPU_SHARE, WAIT_WINDOW_S, QueueStore, awaiting, change, cpu_seconds, get,  # noqa: F401
                              post, say, served, small_goal, tuneloop, wait_until)  # (served: a fixture)


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
    assert [d["data"]["who"] for d in vetoes] == ["approver1 (api)", "approver1 (chat)", "approver1 (chat)", "carol (cli)"]
    assert all(d["data"]["source"] == "person" and "not a measurement" in d["text"] for d in vetoes)
    ran = {e["candidate_id"] for e in get(srv, f"/goals/{gid}/experiments")}
    assert ran == {ref["id"]}
    why = say(srv, gid, f"why was {rejected[2]['id']} rejected?")["reply"]
    assert "这个改动风险太大" in why
    assert not [d for d in log if d["kind"] == "negative"]  # a veto is not a measurement
    state_md = (tmp_path / "runs" / gid / "STATE.md").read_text()
    assert state_md.count("- vetoed: ") == 4 and "rejected by carol (cli): not during business hours" in state_md

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

    # N = 160 (confirm 180): a screen holds up to 160 requests in flight, so C 90 and C 160 both change the load
    # (at N = 40 neither C would: such a move is no candidate, agent/planner/screens.py)
    g = small_goal("all-vetoed", experiments=4, n=160)
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
        # C 128 -> 90 was proposed and rejected; C -> 160 never reached a person: the reference's achieved
        # concurrency is well under C = 128, so raising C cannot add load (agent/planner/inert.py)
        assert {(v.knob, v.value) for v in st.vetoes(gid)} == {("concurrency", 90)}
        assert "nothing left that was not rejected: 1 of the 2 remaining" in st.get_goal(gid).status_reason
    finally:
        st.close()


def test_one_more_round_at_c90_on_a_waiting_goal_by_chat_and_on_a_finished_goal_by_rest(served, tmp_path):
    srv = served
    # a goal waiting for approval of its next card: the instruction waits for that decision (a person's card is
    # never replaced by it), then runs C90 once and stops
    gid = post(srv, "/goals", small_goal("c90-running", experiments=6), role="admin", code=201).json()["id"]
    ref = wait_until(lambda: awaiting(srv, gid), what="the reference card")[0]
    post(srv, f"/candidates/{ref['id']}/approve", {"card_hash": ref["card_hash"]}, code=200)
    pending = wait_until(lambda: awaiting(srv, gid, {ref["id"]}), what="a second card")[0]
    best = get(srv, f"/goals/{gid}/best")
    out = say(srv, gid, "one more round at C90")
    assert "concurrency=90" in out["reply"] and f"queued: candidate {pending['id']} waits" in out["reply"]
    wait_until(lambda: get(srv, f"/goals/{gid}")["worker_state"] == "idle", what="the woken goal to be given back")
    assert pending["id"] in [c["id"] for c in awaiting(srv, gid)]  # still the person's to decide
    assert say(srv, gid, f"reject {pending['id']} because C90 first")["action"]["decision"] == "reject"
    g = wait_until(lambda: (x := get(srv, f"/goals/{gid}"))["status"] == "stopped" and x, what="the round to end")
    assert "instruction fulfilled: 1 more round(s) ran" in g["status_reason"]
    runs = get(srv, f"/goals/{gid}/experiments")
    assert len(runs) == 2 and runs[0]["candidate_id"] == ref["id"]
    card = get(srv, f"/candidates/{runs[1]['candidate_id']}")["card"]
    # the best station was measured at confirm N only: the instructed change is compared there
    assert card["change"] == {"knob": "concurrency", "old": 128, "new": 90} and card["stage"] == "confirm"
    assert all(best["knobs"].get(k) == v for k, v in card["parent_knobs"].items())  # from the best station
    assert get(srv, f"/candidates/{pending['id']}")["status"] == "rejected"  # decided by the person, never run

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

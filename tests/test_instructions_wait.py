"""Instructions never override a person (issue 44): an instruction given while a card waits for a person takes
effect after that decision, not instead of it; a second of the same kind is refused and the answer says so; a
round is judged against a reference measured first. Through the REST API of a service running the simulator."""
from __future__ import annotations

from test_api_support import auth, small_goal, wait_until
from test_chat import client  # noqa: F401  (the API with a sqlite store and its worker)

from agent.report.people import gather_people


def _awaiting(c, gid):
    return c.get(f"/goals/{gid}/candidates?awaiting=true", headers=auth("viewer")).json()


def _idle(c, gid):
    svc = c.app.state.service
    return svc.store.work_item(gid).state == "idle"


def test_rounds_sent_while_the_baseline_waits_run_after_it_and_all_of_them_run(client):  # noqa: F811
    c = client
    goal = small_goal(experiments=10)
    gid = c.post("/goals", json=goal, headers=auth("admin")).json()["id"]
    base = wait_until(lambda: _awaiting(c, gid))[0]
    at = goal["search_space"]["concurrency"][0]  # below the baseline's C: not inert on the simulator
    r = c.post(f"/goals/{gid}/instructions", json={"kind": "one_more_round", "count": 3, "knobs": {"concurrency": at}},
               headers=auth("approver"))
    assert r.status_code == 201, r.text
    rounds = r.json()
    assert f"queued: candidate {base['id']} waits for a person's decision" in rounds["note"]
    again = c.post(f"/goals/{gid}/instructions", json={"kind": "one_more_round", "count": 1},
                   headers=auth("approver"))  # a second of the same kind: refused, and the answer says which
    assert again.status_code == 409 and f"refused: instruction {rounds['id']} " in again.json()["detail"]
    wait_until(lambda: _idle(c, gid), what="the woken loop to give the goal back")
    assert [x["id"] for x in _awaiting(c, gid)] == [base["id"]]  # still waiting: not cancelled, not superseded
    c.post(f"/candidates/{base['id']}/approve", json={"card_hash": base["card_hash"]}, headers=auth("approver"))

    def ended():
        for cand in _awaiting(c, gid):  # the planner's rounds ask like any card: a person approves them
            c.post(f"/candidates/{cand['id']}/approve", json={"card_hash": cand["card_hash"]}, headers=auth("approver"))
        g = c.get(f"/goals/{gid}", headers=auth("viewer")).json()
        return g["status"] in ("done", "stopped") and _idle(c, gid) and g

    g = wait_until(ended, what="the rounds to run")
    ins = {i["id"]: i for i in c.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json()}
    assert ins[rounds["id"]]["outcome"] == "done: 3 more round(s) ran", (g, ins)
    assert ins[int(again.json()["detail"].split()[1])]["outcome"].startswith(f"refused: instruction {rounds['id']} ")
    cands = c.get(f"/goals/{gid}/candidates", headers=auth("viewer")).json()
    runs = c.get(f"/goals/{gid}/experiments", headers=auth("viewer")).json()
    ran = {r["candidate_id"] for r in runs}
    assert base["id"] in ran  # the approved baseline ran
    assert not any("superseded by instruction" in (x.get("status_reason") or "") for x in cands)
    at_c = [x for x in cands if x["id"] in ran and (x["card"].get("change") or {}).get("new") == at]
    assert at_c, "the round at the asked value ran"
    decisions = c.get(f"/goals/{gid}/decisions", headers=auth("viewer")).json()
    assert not any("cannot judge" in d["text"] for d in decisions)  # every round had its reference
    about_base = [d for d in decisions if d["candidate_id"] == base["id"] and d["kind"] != "ask"]
    assert about_base and all((d["who"], d["via"]) == ("approver1", "api") for d in about_base)


def test_a_pause_sent_while_a_card_waits_lets_the_person_decide_first(client):  # noqa: F811
    c = client
    gid = c.post("/goals", json=small_goal(experiments=3), headers=auth("admin")).json()["id"]
    base = wait_until(lambda: _awaiting(c, gid))[0]
    r = c.post(f"/goals/{gid}/pause", headers=auth("approver"))
    assert r.status_code == 200 and "queued" in r.json()["note"] and r.json()["who"] == "approver1 (api)"
    twice = c.post(f"/goals/{gid}/pause", headers=auth("approver"))
    assert twice.status_code == 409 and f"instruction {r.json()['id']} " in twice.json()["detail"]
    wait_until(lambda: _idle(c, gid), what="the woken loop to give the goal back")
    assert c.get(f"/goals/{gid}", headers=auth("viewer")).json()["status"] == "waiting"  # not paused over the card
    ok = c.post(f"/candidates/{base['id']}/approve", json={"card_hash": base["card_hash"]}, headers=auth("approver"))
    assert ok.status_code == 200, ok.text  # the person could still decide
    wait_until(lambda: c.get(f"/goals/{gid}", headers=auth("viewer")).json()["status"] == "paused" and _idle(c, gid),
               what="the pause to take effect after the decision")
    assert c.get(f"/candidates/{base['id']}/approval", headers=auth("viewer")).json()["decision"] == "approve"
    # the report's "where" column: every instruction says where it came from, the refused one too
    people, _ = gather_people(c.app.state.service.store, gid, {})
    assert [(p.kind, p.via) for p in people] == [("instruction: pause", "api"), ("instruction: pause", "api")]
    assert people[1].outcome.startswith(f"refused: instruction {r.json()['id']} ")

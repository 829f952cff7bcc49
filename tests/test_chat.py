"""Chat: the deterministic intent parser (English and Chinese) and its actions through the API."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from test_api_support import TOKENS_ENV, auth, small_goal, wait_until

from api.app import create_app
from api.chat import parse
from api.settings import Settings

CASES = [
    ("approve 7", {"kind": "approve", "candidate_id": 7}),
    ("Approve candidate #12", {"kind": "approve", "candidate_id": 12}),
    ("批准 7", {"kind": "approve", "candidate_id": 7}),
    ("reject 3 because TPOT is too close to the limit", {"kind": "reject", "candidate_id": 3,
                                                         "reason": "TPOT is too close to the limit"}),
    ("拒绝 3 因为 TPOT 太高", {"kind": "reject", "candidate_id": 3, "reason": "TPOT 太高"}),
    ("pause", {"kind": "pause"}), ("暂停", {"kind": "pause"}),
    ("resume", {"kind": "resume"}), ("继续", {"kind": "resume"}),
    ("stop", {"kind": "stop"}), ("停止", {"kind": "stop"}),
    ("one more round at C90", {"kind": "one_more_round", "count": 1, "knobs": {"concurrency": 90}}),
    ("two more rounds at C=64", {"kind": "one_more_round", "count": 2, "knobs": {"concurrency": 64}}),
    ("再跑一轮 C90", {"kind": "one_more_round", "count": 1, "knobs": {"concurrency": 90}}),
    ("go back to the best", {"kind": "restore_best"}), ("回到最佳", {"kind": "restore_best"}),
    ("status", {"kind": "status"}), ("状态", {"kind": "status"}),
    ("why was 12 rejected?", {"kind": "why_rejected", "candidate_id": 12}),
    ("为什么拒绝了 12", {"kind": "why_rejected", "candidate_id": 12}),
    ("12 为什么被拒绝", {"kind": "why_rejected", "candidate_id": 12}),
    ("approve 5 0123456789abcdef", {"kind": "approve", "candidate_id": 5, "card_hash": "0123456789abcdef"}),
    ("what a nice day", {"kind": "unknown"}),
]


@pytest.mark.parametrize("text,want", CASES)
def test_parser(text, want):
    assert parse(text).model_dump(exclude_defaults=True) | {"kind": parse(text).kind} == want


@pytest.fixture
def client(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Settings.from_env({"TUNELOOP_TOKENS": TOKENS_ENV, "TUNELOOP_DB": f"sqlite:///{tmp_path / 't.db'}",
                           "TUNELOOP_RUNS_ROOT": str(tmp_path / "runs"), "TUNELOOP_POLL_S": "0.05"})
    with TestClient(create_app(s)) as c:
        yield c


def say(c, gid: str, text: str, role: str = "approver") -> dict:
    r = c.post(f"/goals/{gid}/chat", json={"text": text}, headers=auth(role))
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_drives_the_loop_and_cites_ids_and_figures(client):
    c = client
    gid = c.post("/goals", json=small_goal(experiments=3), headers=auth("admin")).json()["id"]
    first = wait_until(lambda: c.get(f"/goals/{gid}/candidates?awaiting=true", headers=auth("viewer")).json())[0]
    out = say(c, gid, f"批准 {first['id']}")
    assert out["action"] == {"candidate_id": first["id"], "decision": "approve"}
    assert first["card_hash"] in out["reply"]
    ap = c.get(f"/candidates/{first['id']}/approval", headers=auth("viewer")).json()
    assert ap["who"] == "approver1 (chat)"
    second = wait_until(lambda: [x for x in c.get(f"/goals/{gid}/candidates?awaiting=true", headers=auth("viewer")).json()
                                 if x["id"] != first["id"]])[0]
    status = say(c, gid, "status", role="viewer")["reply"]
    run = c.get(f"/goals/{gid}/experiments", headers=auth("viewer")).json()[0]
    assert run["id"] in status and "tok/s/card at N=60" in status and f"candidate {second['id']}" in status
    out = say(c, gid, f"reject {second['id']} because the client is not the bottleneck")
    assert out["action"]["decision"] == "reject"
    why = say(c, gid, f"why was {second['id']} rejected?", role="viewer")["reply"]
    assert "approver1 (chat)" in why and "the client is not the bottleneck" in why
    # in another goal's chat the same number is not that goal's card: no answer about someone else's card
    other = c.post("/goals", json=small_goal("other-goal", ask=False, experiments=1), headers=auth("admin")).json()["id"]
    r = c.post(f"/goals/{other}/chat", json={"text": f"why was {second['id']} rejected?"}, headers=auth("viewer"))
    assert r.status_code == 404 and f"no such candidate in goal {other}" in r.json()["detail"], r.text
    out = say(c, gid, "one more round at C90")
    ins = c.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json()[-1]
    assert (ins["kind"], ins["count"], ins["knobs"], ins["who"]) == ("one_more_round", 1, {"concurrency": 90}, "approver1 (chat)")
    assert "concurrency=90" in out["reply"]
    assert say(c, gid, "暂停")["action"]["instruction"] > ins["id"]
    assert c.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json()[-1]["kind"] == "pause"
    assert "approve N" in say(c, gid, "hello there", role="viewer")["reply"]
    r = c.post(f"/goals/{gid}/chat", json={"text": "go back to the best"}, headers=auth("approver"))
    assert r.status_code == 403 and "station.restore needs admin" in r.json()["detail"]  # as on every restore path
    back = say(c, gid, "go back to the best", role="admin")["reply"]
    best = c.get(f"/goals/{gid}/best", headers=auth("viewer")).json()
    assert best["hash"] in back and run["id"] in back


def test_go_back_to_the_best_is_queued_once_run_by_the_loop_and_logged_with_who_asked(client, tmp_path):
    c = client
    gid = c.post("/goals", json=small_goal("back-goal", ask=False, experiments=2), headers=auth("admin")).json()["id"]
    wait_until(lambda: c.get(f"/goals/{gid}", headers=auth("viewer")).json()["status"] == "done", what="the goal to finish")
    best = c.get(f"/goals/{gid}/best", headers=auth("viewer")).json()
    out = say(c, gid, "go back to the best", role="admin")
    assert out["reply"].startswith(f"queued: go back to the best station {best['hash']}") and "decision log" in out["reply"]
    assert out["action"]["station"] == best["hash"]

    def restored():
        ds = [d for d in c.get(f"/goals/{gid}/decisions", headers=auth("viewer")).json() if d["kind"] == "restore"]
        return ds if ds and c.get(f"/goals/{gid}", headers=auth("viewer")).json()["worker_state"] == "idle" else None

    [rec] = wait_until(restored, what="the loop to carry the restore out")
    assert rec["station_hash"] == best["hash"] and rec["data"]["asked_by"] == "admin1 (chat)"
    assert rec["data"]["result"]["healthy"] and rec["data"]["result"]["identical"]
    assert "as asked by admin1" in rec["text"]
    ins = c.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json()[-1]
    assert (ins["kind"], ins["restore"], ins["who"], ins["active"]) == ("restore", best["hash"], "admin1 (chat)", False)
    # a later wake (e.g. a restart of the service) does not restore again: the instruction was carried out
    svc = c.app.state.service
    svc.store.wake(gid, "test")
    wait_until(lambda: svc.store.work_item(gid).state == "idle", what="the woken goal to be given back")
    assert [d["kind"] for d in c.get(f"/goals/{gid}/decisions", headers=auth("viewer")).json()].count("restore") == 1
    assert len(list((tmp_path / "runs").glob(f"restore-{best['hash']}-*"))) == 1  # the executor re-deployed exactly once

    # the station endpoint takes the same path: a queued instruction of the goal that ran it (202)
    r = c.post(f"/stations/{best['hash']}/restore", headers=auth("admin"))
    assert r.status_code == 202 and (r.json()["kind"], r.json()["who"]) == ("restore", "admin1 (api)")
    wait_until(lambda: len([d for d in c.get(f"/goals/{gid}/decisions", headers=auth("viewer")).json()
                            if d["kind"] == "restore"]) == 2, what="the second, separately asked restore")
    assert len(list((tmp_path / "runs").glob(f"restore-{best['hash']}-*"))) == 2
    bad = c.post(f"/goals/{gid}/instructions", json={"kind": "restore", "restore": "f" * 16}, headers=auth("admin"))
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "restore"]

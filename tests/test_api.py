"""REST API in process: 422 with field names, roles on every mutating endpoint, approvals bound to the
card hash (stale refused, second 409), and a bounded schemathesis run over the OpenAPI spec."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.service import Service
from api.settings import Settings
from test_api_support import TOKENS, TOKENS_ENV, auth, small_goal, wait_until

# every mutating endpoint and the least role it needs (a new one must be added here, see the test below)
MUTATING = {
    ("POST", "/goals"): "admin",
    ("POST", "/goals/{goal_id}/pause"): "approver",
    ("POST", "/goals/{goal_id}/resume"): "approver",
    ("POST", "/goals/{goal_id}/stop"): "approver",
    ("POST", "/goals/{goal_id}/instructions"): "approver",
    ("POST", "/goals/{goal_id}/chat"): "viewer",  # asking is a viewer's; acting through chat needs approver
    ("POST", "/candidates/{candidate_id}/approve"): "approver",
    ("POST", "/candidates/{candidate_id}/reject"): "approver",
    ("POST", "/stations/{station_hash}/restore"): "admin",
    ("POST", "/goals/{goal_id}/budget/extensions"): "approver",
    ("POST", "/goals/{goal_id}/budget/extensions/refuse"): "approver",
}
BELOW = {"viewer": None, "approver": "viewer", "admin": "approver"}


def settings(tmp_path, **env: str) -> Settings:
    return Settings.from_env({"TUNELOOP_TOKENS": TOKENS_ENV, "TUNELOOP_DB": f"sqlite:///{tmp_path / 't.db'}",
                              "TUNELOOP_RUNS_ROOT": str(tmp_path / "runs"), "TUNELOOP_POLL_S": "0.05", **env})


@pytest.fixture
def client(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with TestClient(create_app(settings(tmp_path))) as c:
        yield c


@pytest.fixture
def idle_client(tmp_path, monkeypatch):
    """No workers: the store is changed only by the requests of the test."""
    monkeypatch.chdir(tmp_path)
    with TestClient(create_app(settings(tmp_path, TUNELOOP_WORKERS="0"))) as c:
        yield c


def fill(path: str, goal_id: str = "g", cid: int = 1, station: str = "0" * 16) -> str:
    return path.format(goal_id=goal_id, candidate_id=cid, station_hash=station)


def test_every_mutating_endpoint_is_listed_with_its_role(idle_client):
    spec = idle_client.get("/openapi.json").json()
    found = {(m.upper(), path) for path, ops in spec["paths"].items() for m in ops if m.upper() not in ("GET", "HEAD")}
    assert found == set(MUTATING)


@pytest.mark.parametrize("method,path", sorted(MUTATING))
def test_role_checks_401_without_token_403_below_the_role(idle_client, method, path):
    gid = idle_client.post("/goals", json=small_goal(), headers=auth("admin")).json()["id"]
    url = fill(path, gid)
    assert idle_client.request(method, url, json={}).status_code == 401
    assert idle_client.request(method, url, json={}, headers={"Authorization": "Bearer not-a-token"}).status_code == 401
    below = BELOW[MUTATING[(method, path)]]
    if below:
        r = idle_client.request(method, url, json={}, headers=auth(below))
        assert r.status_code == 403 and below in r.json()["detail"]
    # the role itself gets past auth (a validation or lookup answer, never 401/403)
    assert idle_client.request(method, url, json={}, headers=auth(MUTATING[(method, path)])).status_code not in (401, 403)


def test_viewer_cannot_act_through_chat(idle_client):
    gid = idle_client.post("/goals", json=small_goal(), headers=auth("admin")).json()["id"]
    assert idle_client.post(f"/goals/{gid}/chat", json={"text": "pause"}, headers=auth("viewer")).status_code == 403
    r = idle_client.post(f"/goals/{gid}/chat", json={"text": "status"}, headers=auth("viewer"))
    assert r.status_code == 200 and gid in r.json()["reply"]
    assert idle_client.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json() == []


def test_invalid_goal_gets_422_naming_each_field(idle_client):
    bad = small_goal()
    bad["constraints"]["tpot_mean_ms_lt"] = -1
    bad["start_knobs"]["max_prefill_reqs"] = "lots"
    bad["scenario"] = "no-such-scenario"
    del bad["budget"]["experiments"]
    r = idle_client.post("/goals", json=bad, headers=auth("admin"))
    assert r.status_code == 422
    fields = {".".join(e["loc"]) for e in r.json()["detail"]}
    assert {"body.constraints.tpot_mean_ms_lt", "body.scenario", "body.budget.experiments"} <= fields
    assert any(f.startswith("body.start_knobs.max_prefill_reqs") for f in fields)
    assert idle_client.get("/goals", headers=auth("viewer")).json() == []


def test_invalid_requests_get_422_with_field_messages(idle_client):
    gid = idle_client.post("/goals", json=small_goal(), headers=auth("admin")).json()["id"]
    r = idle_client.post(f"/goals/{gid}/instructions", json={"kind": "one_more_round", "count": 0}, headers=auth("approver"))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "count"]
    r = idle_client.post(f"/goals/{gid}/instructions", json={"kind": "one_more_round", "knobs": {"concurrency": "x"}},
                         headers=auth("approver"))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:3] == ["body", "knobs", "concurrency"]
    r = idle_client.post("/candidates/1/reject", json={"card_hash": "0" * 16}, headers=auth("approver"))
    assert r.status_code == 422 and ["body", "reason"] in [e["loc"] for e in r.json()["detail"]]
    r = idle_client.post("/candidates/1/approve", json={"card_hash": "short"}, headers=auth("approver"))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "card_hash"]


def test_loop_waits_approval_is_bound_to_the_card_hash_stale_refused_second_409(client):
    gid = client.post("/goals", json=small_goal(), headers=auth("admin")).json()["id"]
    card = wait_until(lambda: client.get(f"/goals/{gid}/candidates?awaiting=true", headers=auth("viewer")).json(),
                      what="a card awaiting approval")[0]
    svc = client.app.state.service
    changed = svc.store.update_card(card["id"], {**card["card"], "note": "edited after it was shown"})
    r = client.post(f"/candidates/{card['id']}/approve", json={"card_hash": card["card_hash"]}, headers=auth("approver"))
    assert r.status_code == 409 and "changed since it was shown" in r.json()["detail"]
    assert svc.store.approval(card["id"]) is None
    r = client.post(f"/candidates/{card['id']}/approve", json={"card_hash": changed.card_hash}, headers=auth("approver"))
    assert r.status_code == 200 and r.json()["who"].startswith("approver1")
    r = client.post(f"/candidates/{card['id']}/reject", json={"card_hash": changed.card_hash, "reason": "late"},
                    headers=auth("approver"))
    assert r.status_code == 409
    run = wait_until(lambda: client.get(f"/goals/{gid}/experiments", headers=auth("viewer")).json(), what="the run")
    assert run[0]["candidate_id"] == card["id"]
    exp = wait_until(lambda: client.get(f"/experiments/{run[0]['id']}", headers=auth("viewer")).json()["verdict"] and
                     client.get(f"/experiments/{run[0]['id']}", headers=auth("viewer")).json(), what="a verdict")
    assert exp["verdict"] == "valid" and "tok/s/card at N=40" in exp["figures"]
    phases = client.get(f"/experiments/{run[0]['id']}/phases", headers=auth("viewer")).json()
    assert [p["phase"] for p in phases][:2] == ["lock", "lock"] and phases[-1]["phase"] == "release"
    raw = client.get(f"/experiments/{run[0]['id']}/raw", headers=auth("viewer"))
    assert raw.status_code == 200 and raw.content[:2] == b"\x1f\x8b"
    assert client.get(f"/goals/{gid}/budget", headers=auth("viewer")).json()["experiments_used"] >= 1
    png = client.get(f"/goals/{gid}/frontier.png", headers=auth("viewer"))
    assert png.headers["content-type"] == "image/png" and png.content[:4] == b"\x89PNG"


def test_report_html_markdown_and_images_under_the_services_reports_folder(tmp_path, monkeypatch):
    import re

    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    s = settings(tmp_path, TUNELOOP_DB=f"sqlite:///{tmp_path / 'db' / 't.db'}",
                 TUNELOOP_RUNS_ROOT=str(tmp_path / "svc" / "runs"))
    with TestClient(create_app(s)) as c:
        gid = c.post("/goals", json=small_goal("report-goal", ask=False, experiments=1), headers=auth("admin")).json()["id"]
        wait_until(lambda: c.get(f"/goals/{gid}", headers=auth("viewer")).json()["status"] == "done", what="the goal")
        best = c.get(f"/goals/{gid}/best", headers=auth("viewer")).json()
        run = c.get(f"/goals/{gid}/experiments", headers=auth("viewer")).json()[0]
        r = c.get(f"/goals/{gid}/report", headers=auth("viewer"))
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        html = r.text
        assert gid in html and best["hash"] in html and run["id"] in html and f"tuneloop restore {best['hash']}" in html
        assert "<script src" not in html and "http://" not in html.replace("http://www.w3.org", "")  # self-contained
        md = c.get(f"/goals/{gid}/report.md", headers=auth("viewer"))
        assert md.headers["content-type"].startswith("text/markdown") and best["hash"] in md.text
        links = re.findall(r"\]\((images/[^)]+\.png)\)", md.text)
        assert links, "the Markdown twin links its plots"
        png = c.get(f"/goals/{gid}/{links[0]}", headers=auth("viewer"))  # relative to /goals/{id}/report.md
        assert png.status_code == 200 and png.content[:4] == b"\x89PNG"
        assert c.get(f"/goals/{gid}/images/..%2Ft.db", headers=auth("viewer")).status_code == 404
        assert c.get(f"/goals/{gid}/report", headers={}).status_code == 401
        assert c.get("/goals/nope/report", headers=auth("viewer")).status_code == 404
        summary = c.get(f"/goals/{gid}/summary", headers=auth("viewer")).text
        assert f"goal {gid}: done" in summary and best["hash"] in summary
    out = tmp_path / "svc" / "reports" / gid
    assert best["hash"] in (out / "report.html").read_text(encoding="utf-8") and (out / "report.md").is_file()
    assert (out / links[0]).is_file()
    assert not any((tmp_path / "cwd").iterdir()) and not (tmp_path / "db" / "reports").exists()


def test_health_metrics_and_openapi_show_no_secret(idle_client):
    body = idle_client.get("/health").text + idle_client.get("/metrics").text + idle_client.get("/openapi.json").text
    assert all(t not in body for t in TOKENS.values())
    assert "tuneloop_api_requests_total" in idle_client.get("/metrics").text


# -- schemathesis: a bounded run over the spec ---------------------------------------------------------------
schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, settings as hsettings  # noqa: E402

_FUZZ: dict[str, Service] = {}


def _fuzz_app():
    import tempfile
    from pathlib import Path

    tmp = Path(tempfile.mkdtemp(prefix="tuneloop-fuzz-"))
    svc = Service.open(settings(tmp, TUNELOOP_WORKERS="0"))
    _FUZZ["svc"] = svc
    return create_app(service=svc)


APP = _fuzz_app()
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)
FUZZ = hsettings(max_examples=6, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                 suppress_health_check=list(HealthCheck))


@SCHEMA.parametrize()
@FUZZ
def test_schemathesis_no_5xx_with_an_admin_token(case):
    r = case.call(headers=auth("admin"))
    assert r.status_code < 500, f"{case.method} {case.formatted_path} -> {r.status_code}: {r.text[:300]}"


@SCHEMA.parametrize()
@FUZZ
def test_schemathesis_no_unauthenticated_mutation(case):
    r = case.call()
    if case.method.upper() != case.operation.method.upper():  # a probe with a method the path does not have
        assert r.status_code == 405
    elif case.method.upper() not in ("GET", "HEAD"):
        # 401; a request the HTTP layer cannot even route (control characters in the path) gets 400
        assert r.status_code in (400, 401), f"{case.method} {case.formatted_path} without a token -> {r.status_code}"
    else:
        assert r.status_code < 500

"""REST API in process: 422 with field names, roles on every mutating endpoint, approvals bound to the
card hash (stale refused, second 409), and a bounded schemathesis run over the OpenAPI spec."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from test_api_support import TOKENS, TOKENS_ENV, auth, small_goal, wait_until
from unavailable import need_module

from api.app import create_app
from api.service import Service
from api.settings import Settings

# every mutating endpoint and the least role it needs (a new one must be added here, see the test below)
MUTATING = {
    ("POST", "/goals"): "admin",
    ("POST", "/goals/{goal_id}/pause"): "approver",
    ("POST", "/goals/{goal_id}/resume"): "approver",
    ("POST", "/goals/{goal_id}/stop"): "approver",
    ("POST", "/goals/{goal_id}/instructions"): "approver",
    ("POST", "/goals/{goal_id}/chat"): "viewer",  # asking is a viewer's; acting: the action's role (api/permissions.py)
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
    for blank in ("   ", "\n\t"):  # a reason must say something: white space alone is refused, not recorded
        r = idle_client.post("/candidates/1/reject", json={"card_hash": "0" * 16, "reason": blank},
                             headers=auth("approver"))
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "reason"], r.text
        r = idle_client.post(f"/goals/{gid}/budget/extensions/refuse", json={"reason": blank}, headers=auth("approver"))
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "reason"], r.text
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
    assert exp["verdict"] == "valid" and "tok/s/card at N=60" in exp["figures"]
    # one meaning of "station hash": a card names its station and its parent's by the frozen hash /stations knows
    nxt = wait_until(lambda: [c for c in client.get(f"/goals/{gid}/candidates?awaiting=true", headers=auth("viewer")).json()
                              if c["id"] != card["id"]], what="the next card")[0]
    first = client.get(f"/candidates/{card['id']}", headers=auth("viewer")).json()
    assert first["station_hash"] == exp["station_hash"] and nxt["parent_station_hash"] == exp["station_hash"]
    # a reference at another N measures the same station; a change is frozen only when its run prepares it
    assert nxt["station_hash"] == (exp["station_hash"] if nxt["card"]["change"] is None else None)
    st = client.get(f"/stations/{exp['station_hash']}", headers=auth("viewer"))
    assert st.status_code == 200 and st.json()["hash"] == exp["station_hash"]
    assert not {"station", "parent_station"} & set(first["card"])  # the knobs digests are named as such
    assert first["card"]["knobs_hash"] != exp["station_hash"]
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
        # the dashboard's frontier is the report's plot, byte for byte (one function draws both)
        report_plot = c.get(f"/goals/{gid}/images/tput_tpot_mean.png", headers=auth("viewer")).content  # its one limit
        assert c.get(f"/goals/{gid}/frontier.png", headers=auth("viewer")).content == report_plot
        assert c.get(f"/goals/{gid}/images/..%2Ft.db", headers=auth("viewer")).status_code == 404
        assert c.get(f"/goals/{gid}/report", headers={}).status_code == 401
        assert c.get("/goals/nope/report", headers=auth("viewer")).status_code == 404
        summary = c.get(f"/goals/{gid}/summary", headers=auth("viewer")).text
        assert f"goal {gid}: done" in summary and best["hash"] in summary
    # the directory the API names for the experiment is what `tuneloop load export` / `load summarize` take
    import json
    import subprocess
    import sys

    assert run["run_dir"] == str((tmp_path / "svc" / "runs" / run["id"]).resolve())
    cli = [sys.executable, "-m", "tuneloop_cli", "load"]
    exp = subprocess.run(cli + ["export", run["run_dir"]], capture_output=True, text=True, timeout=120)
    assert exp.returncode == 0, exp.stderr[-2000:]
    assert json.loads(exp.stdout)["completed"] == run["n"]
    csv_out = subprocess.run(cli + ["export", run["run_dir"], "--format", "csv"], capture_output=True, text=True,
                             timeout=120)
    assert csv_out.returncode == 0 and len(csv_out.stdout.strip().splitlines()) == run["n"] + 1  # header + rows
    summ = subprocess.run(cli + ["summarize", run["run_dir"]], capture_output=True, text=True, timeout=120)
    assert summ.returncode == 0 and "verdict: valid" in summ.stdout, summ.stderr[-2000:]
    bad = subprocess.run(cli + ["export", str(tmp_path / "svc")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "run.json" in bad.stderr and "Traceback" not in bad.stderr
    out = tmp_path / "svc" / "reports" / gid
    assert best["hash"] in (out / "report.html").read_text(encoding="utf-8") and (out / "report.md").is_file()
    assert (out / links[0]).is_file()
    assert not any((tmp_path / "cwd").iterdir()) and not (tmp_path / "db" / "reports").exists()


def test_post_goal_as_yaml_or_json_with_goalspec_as_the_openapi_body(idle_client):
    import yaml

    body = yaml.safe_dump(small_goal("yaml-goal"), allow_unicode=True)
    r = idle_client.post("/goals", content=body, headers=auth("admin") | {"Content-Type": "application/yaml"})
    assert r.status_code == 201 and r.json()["name"] == "yaml-goal" and r.json()["budget"]["experiments_limit"] == 2
    bad = yaml.safe_dump({**small_goal("yaml-bad"), "budget": {"card_hours": -1, "experiments": 2}})
    r = idle_client.post("/goals", content=bad, headers=auth("admin") | {"Content-Type": "application/yaml"})
    assert r.status_code == 422 and ["body", "budget", "card_hours"] in [e["loc"] for e in r.json()["detail"]]
    r = idle_client.post("/goals", content="name: [unclosed", headers=auth("admin") | {"Content-Type": "application/yaml"})
    assert r.status_code == 422 and "not valid YAML" in r.json()["detail"][0]["msg"]
    r = idle_client.post("/goals", content="{", headers=auth("admin") | {"Content-Type": "application/json"})
    assert r.status_code == 422 and "not valid JSON" in r.json()["detail"][0]["msg"]
    r = idle_client.post("/goals", content=body, headers=auth("admin") | {"Content-Type": "text/plain"})
    assert r.status_code == 415
    assert [g["name"] for g in idle_client.get("/goals", headers=auth("viewer")).json()] == ["yaml-goal"]
    doc = idle_client.get("/openapi.json").json()
    content = doc["paths"]["/goals"]["post"]["requestBody"]["content"]
    assert set(content) == {"application/json", "application/yaml"}
    assert content["application/yaml"]["schema"] == {"$ref": "#/components/schemas/GoalSpec"}
    goal = doc["components"]["schemas"]["GoalSpec"]
    assert {"name", "scenario", "constraints", "budget"} <= set(goal["required"])
    assert goal["properties"]["budget"] == {"$ref": "#/components/schemas/Budget"}
    assert "card_hours" in doc["components"]["schemas"]["Budget"]["properties"]


def test_goal_shows_the_running_experiment_its_phase_and_requests_done(idle_client, tmp_path):
    """What the runner leaves while a load runs (its phase records, progress.json) is what GET /goals/G shows."""
    import json

    from agent.planner.candidates import build_card
    from agent.loop.record import card_record
    from core.trial import TrialSpec

    gid = idle_client.post("/goals", json=small_goal("progress-goal"), headers=auth("admin")).json()["id"]
    store = idle_client.app.state.service.store
    g = idle_client.get(f"/goals/{gid}", headers=auth("viewer")).json()
    assert g["progress"] is None and g["budget"]["card_hours_used"] == 0
    spec = store.get_goal(gid).spec
    card = build_card(gid, spec.scenario, spec.start_station(), "concurrency", 90, stage="screen", n=40)
    cand = store.add_candidate(gid, card_record(card))
    run = TrialSpec(run_id=card.run_id(), goal_id=gid, target="sim", scenario=spec.scenario, knobs=card.knobs,
                    stage="screen", n=40, warmup=8)
    store.create_run(run, candidate_id=cand.id)
    store.set_run_status(run.run_id, "running")
    epoch = store.acquire_lease("sim", "test", 60)
    for phase in ("lock", "prepare"):
        store.record_phase(run.run_id, phase, "intent", "started", epoch=epoch, target="sim")
        store.record_phase(run.run_id, phase, "outcome", "ok", epoch=epoch, target="sim")
    p = idle_client.get(f"/goals/{gid}", headers=auth("viewer")).json()["progress"]
    assert p["run_id"] == run.run_id and p["candidate_id"] == cand.id and "concurrency 128 -> 90" in p["title"]
    assert (p["phase"], p["phase_state"], p["requests_done"]) == ("prepare", "ok", None)
    assert p["elapsed_s"] >= 0 and p["expected_s"] > 0 and p["est_card_hours"] > 0
    store.record_phase(run.run_id, "load", "intent", "started", epoch=epoch, target="sim")
    (tmp_path / "runs" / run.run_id).mkdir(parents=True, exist_ok=True)
    (tmp_path / "runs" / run.run_id / "progress.json").write_text(json.dumps({"requests_done": 17, "requests_total": 48}))
    p = idle_client.get(f"/goals/{gid}", headers=auth("viewer")).json()["progress"]
    assert (p["phase"], p["phase_state"], p["requests_done"], p["requests_total"]) == ("load", "started", 17, 48)
    assert p["experiments_limit"] == 2 and p["card_hours_limit"] == 24
    store.record_phase(run.run_id, "load", "outcome", "ok", epoch=epoch, target="sim")
    p = idle_client.get(f"/goals/{gid}", headers=auth("viewer")).json()["progress"]
    assert (p["requests_done"], p["requests_total"]) == (48, 48)  # the load ended: the count is final
    store.set_run_status(run.run_id, "done")
    assert idle_client.get(f"/goals/{gid}", headers=auth("viewer")).json()["progress"] is None


def test_health_metrics_and_openapi_show_no_secret(idle_client):
    body = idle_client.get("/health").text + idle_client.get("/metrics").text + idle_client.get("/openapi.json").text
    assert all(t not in body for t in TOKENS.values())
    assert "tuneloop_api_requests_total" in idle_client.get("/metrics").text


# -- schemathesis: a bounded run over the spec ---------------------------------------------------------------
schemathesis = need_module("schemathesis")
from hypothesis import HealthCheck, Phase  # noqa: E402
from hypothesis import settings as hsettings

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
FUZZ = hsettings(max_examples=15, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                 suppress_health_check=list(HealthCheck))


@SCHEMA.parametrize()
@FUZZ
def test_schemathesis_no_5xx_with_an_admin_token_and_every_status_code_documented(case):
    from schemathesis.checks import not_a_server_error, status_code_conformance

    r = case.call(headers=auth("admin"))
    assert r.status_code < 500, f"{case.method} {case.formatted_path} -> {r.status_code}: {r.text[:300]}"
    if case.method.upper() == case.operation.method.upper():
        case.validate_response(r, checks=[not_a_server_error, status_code_conformance])


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


def test_docs_and_redoc_load_every_asset_from_the_service_itself(idle_client):
    """/docs and /redoc name no CDN: every script, stylesheet and icon they load is served by this app (a
    cluster's management network often reaches no internet)."""
    import re

    for page in ("/docs", "/redoc"):
        html = idle_client.get(page).text
        assets = re.findall(r'(?:src|href)=["\']([^"\']+)["\']', html) + re.findall(r"url:\s*'([^']+)'", html)
        assets = [a for a in assets if not a.startswith(("#", "data:"))]
        assert assets and not [a for a in assets if "://" in a or a.startswith("//")], (page, assets)
        for a in assets:
            assert idle_client.get(a).status_code == 200, (page, a)

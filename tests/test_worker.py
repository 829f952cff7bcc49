"""A worker whose loop raises: transient errors are retried (bounded), anything else leaves the goal
`failed` with the error in the API, the dashboard's data, the decision log and STATE.md, until a person
resumes it. The real loop runs; only the fault is injected at the worker's entry point (like `faults=`)."""
from __future__ import annotations

import pytest
import sqlalchemy.exc
from fastapi.testclient import TestClient
from test_api_support import TOKENS_ENV, auth, small_goal

from agent.loop.session import run_session
from api.app import create_app
from api.service import Service
from api.settings import Settings
from api.worker import Worker
from state.goal import parse_goal


@pytest.fixture
def svc(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Settings.from_env({"TUNELOOP_TOKENS": TOKENS_ENV, "TUNELOOP_DB": f"sqlite:///{tmp_path / 't.db'}",
                           "TUNELOOP_RUNS_ROOT": str(tmp_path / "runs"), "TUNELOOP_WORKERS": "0",
                           "TUNELOOP_LOOP_ATTEMPTS": "3", "TUNELOOP_RETRY_WAIT_S": "0.01"})
    service = Service.open(s)
    yield service
    service.close()


def flaky(errors: list[Exception]):
    """The real loop, after raising the given errors one call at a time; counts the calls."""
    calls = []

    def session(*args, **kwargs):
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return run_session(*args, **kwargs)

    session.calls = calls  # type: ignore[attr-defined]
    return session


def start(svc: Service, name: str = "w-goal"):
    g = svc.store.create_goal(parse_goal(small_goal(name, experiments=2)))
    svc.store.wake(g.id, "test")
    claim = svc.store.claim("w1", svc.settings.claim_ttl_s)
    assert claim is not None and claim.goal_id == g.id
    return g, claim


def lost_db() -> Exception:
    return sqlalchemy.exc.OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))


def test_transient_errors_are_retried_and_the_loop_then_runs(svc):
    g, claim = start(svc)
    session = flaky([lost_db(), ConnectionResetError("connection reset by peer")])
    w = Worker(svc, "w1", session=session)
    res = w.run_claim(claim)
    assert len(session.calls) == 3 and w.attempts == 3
    assert res.status == "waiting" and res.waiting_for["candidate_id"]  # the loop reached its first approval
    assert svc.store.get_goal(g.id).status == "waiting"
    assert svc.store.work_item(g.id).state == "idle"
    assert not [d for d in svc.store.decisions(g.id) if d.kind == "stop"]


def test_a_transient_error_that_persists_fails_after_the_bounded_attempts(svc):
    g, claim = start(svc)
    session = flaky([lost_db() for _ in range(10)])
    w = Worker(svc, "w1", session=session)
    assert w.run_claim(claim) is None
    assert len(session.calls) == 3  # settings.loop_attempts, then it gives up
    assert svc.store.work_item(g.id).state == "failed"
    reason = svc.store.get_goal(g.id).status_reason
    assert reason.startswith("failed: OperationalError") and "over 3 attempts" in reason


def test_a_permanent_error_fails_at_once_is_shown_everywhere_and_resume_retries(svc, tmp_path):
    g, claim = start(svc)
    session = flaky([RuntimeError("checkpoint for this goal cannot be decoded")])
    w = Worker(svc, "w1", session=session)
    assert w.run_claim(claim) is None
    assert len(session.calls) == 1  # never retried: a second try cannot help
    assert svc.store.work_item(g.id).state == "failed"
    assert svc.store.claim("w2", 30) is None  # no worker picks a failed goal up by itself

    with TestClient(create_app(service=svc)) as c:
        goal = c.get(f"/goals/{g.id}", headers=auth("viewer")).json()
        assert goal["status"] == "failed" and goal["worker_state"] == "failed"
        assert "RuntimeError: checkpoint for this goal cannot be decoded" in goal["status_reason"]
        assert [x["status"] for x in c.get("/goals", headers=auth("viewer")).json()] == ["failed"]  # dashboard list
        state_md = c.get(f"/goals/{g.id}/state", headers=auth("viewer")).text
        assert "- why: failed: RuntimeError: checkpoint for this goal cannot be decoded" in state_md
        assert "RuntimeError" in (tmp_path / "runs" / g.id / "STATE.md").read_text()  # the goal's own file, rewritten
        stop = [d for d in c.get(f"/goals/{g.id}/decisions", headers=auth("viewer")).json() if d["kind"] == "stop"]
        assert stop[-1]["data"]["status"] == "failed" and stop[-1]["data"]["attempts"] == 1
        said = c.post(f"/goals/{g.id}/chat", json={"text": "status"}, headers=auth("viewer")).json()["reply"]
        assert said.startswith(f"goal {g.id}: failed — failed: RuntimeError")
        assert 'tuneloop_goals{status="failed"} 1.0' in c.get("/metrics").text

        assert c.post(f"/goals/{g.id}/resume", headers=auth("approver")).status_code == 200
        assert c.get(f"/goals/{g.id}", headers=auth("viewer")).json()["worker_state"] == "ready"
    again = svc.store.claim("w2", 30)
    assert again is not None and again.goal_id == g.id
    res = Worker(svc, "w2", session=session).run_claim(again)  # the fault is gone: the real loop runs
    assert res.status == "waiting" and svc.store.work_item(g.id).state == "idle"
    assert svc.store.get_goal(g.id).status == "waiting"

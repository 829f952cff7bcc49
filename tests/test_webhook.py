"""Webhooks against a real local HTTP receiver: generic JSON, Slack- and Feishu-compatible bodies on
approval needed, a decision, and the loop's stop."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient
from test_api_support import TOKENS_ENV, auth, small_goal, wait_until

from api.app import create_app
from api.settings import Settings, Webhook
from api.webhooks import Notifier, feishu_sign, payload, verify
from core.escape import feishu_post_text


class Receiver:
    """A real HTTP server on a free port that keeps every JSON body POSTed to it."""

    def __init__(self, fail_first: int = 0):
        self.bodies: list[dict] = []
        self.raw: list[tuple[str, dict, bytes]] = []  # (path, headers, body bytes) of every POST
        self.fail_first = fail_first
        self.cond = threading.Condition()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw)
                with outer.cond:
                    outer.raw.append((self.path, dict(self.headers), raw))
                    if outer.fail_first > 0:
                        outer.fail_first -= 1
                        self.send_response(503)
                        self.end_headers()
                        return
                    outer.bodies.append({"path": self.path, **body})
                    outer.cond.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, pred, timeout: float = 300.0) -> list[dict]:  # a bound on a hang, not an expectation
        with self.cond:
            assert self.cond.wait_for(lambda: pred(self.bodies), timeout), f"received only {self.bodies}"
            return list(self.bodies)

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_payload_shapes():
    assert payload("slack", "decision", "g1", "x")["blocks"][0]["text"]["type"] == "mrkdwn"
    assert payload("feishu", "stopped", "g1", "x") == {"msg_type": "post", "content": {"post": {"zh_cn": {
        "title": "", "content": [[{"tag": "text", "text": "[tuneloop] g1: x"}]]}}}}
    body = payload("json", "approval_needed", "g1", "x", {"candidate_id": 3})
    assert body["event"] == "approval_needed" and body["data"] == {"candidate_id": 3}


def test_retries_a_5xx_then_delivers_and_never_logs_the_url(caplog):
    r = Receiver(fail_first=2)
    n = Notifier([Webhook(url=r.url + "/secret-path-abc", format="json")], attempts=3)
    try:
        n.notify("stopped", "g1", "loop done")
        got = r.wait(lambda b: len(b) == 1)
        assert got[0]["text"] == "loop done"
    finally:
        n.close()  # joins the delivery thread
        r.close()
    assert n.sent == 1 and n.failed == 0
    bad = Notifier([Webhook(url="http://127.0.0.1:9/secret-path-xyz", format="json")], attempts=2)
    bad.notify("stopped", "g1", "x")
    bad.close()
    assert bad.failed == 1 and "secret-path-xyz" not in caplog.text


def test_service_notifies_approval_needed_decision_and_stop_in_three_formats(tmp_path, monkeypatch, receiver):
    monkeypatch.chdir(tmp_path)
    s = Settings.from_env({"TUNELOOP_TOKENS": TOKENS_ENV, "TUNELOOP_DB": f"sqlite:///{tmp_path / 't.db'}",
                           "TUNELOOP_RUNS_ROOT": str(tmp_path / "runs"), "TUNELOOP_POLL_S": "0.05",
                           "TUNELOOP_WEBHOOK_URL": f"{receiver.url}/json", "TUNELOOP_WEBHOOK_SECRET": SECRET})
    assert s.webhooks[0].secret.get_secret_value() == SECRET
    s = s.model_copy(update={"webhooks": tuple(Webhook(url=f"{receiver.url}/{f}", format=f, secret=SECRET)
                                               for f in ("json", "slack", "feishu"))})
    with TestClient(create_app(s)) as c:
        gid = c.post("/goals", json=small_goal(experiments=1), headers=auth("admin")).json()["id"]
        got = receiver.wait(lambda b: any(x.get("event") == "approval_needed" for x in b))
        need = next(x for x in got if x.get("event") == "approval_needed")
        cid, h = need["data"]["candidate_id"], need["data"]["card_hash"]
        assert need["goal_id"] == gid and f"candidate {cid}" in need["text"]
        assert c.post(f"/candidates/{cid}/approve", json={"card_hash": h}, headers=auth("approver")).status_code == 200
        got = receiver.wait(lambda b: any(x.get("event") == "stopped" for x in b)
                            and sum(1 for x in b if x.get("event") == "decision") >= 2
                            and len(b) == 3 * sum(1 for x in b if x["path"] == "/json"))
    events = [x["event"] for x in got if x["path"] == "/json"]
    assert events.index("approval_needed") < events.index("decision") < events.index("stopped")
    decisions = [x for x in got if x.get("event") == "decision"]
    assert any("approved by approver1" in x["text"] for x in decisions)
    assert any(x["data"].get("outcome") for x in decisions)  # the loop's own judgement of the run
    slack = [x for x in got if x["path"] == "/slack"]
    feishu = [x for x in got if x["path"] == "/feishu"]
    assert len(slack) == len(feishu) == len(events)
    assert all(x["blocks"][0]["text"]["text"] == x["text"] for x in slack)
    assert all(x["msg_type"] == "post" and gid in feishu_post_text(x["content"]["post"]) for x in feishu)
    assert receiver.raw and all(verify(SECRET, h, raw) for _, h, raw in receiver.raw)  # every delivery is signed
    assert all(x["sign"] == feishu_sign(SECRET, int(x["timestamp"])) for x in feishu)  # Feishu's own convention


SECRET = "whsec-0123456789abcdef"


def test_a_receiver_verifies_the_signature_and_a_tampered_body_fails(receiver):
    n = Notifier([Webhook(url=receiver.url + "/hook", format="json", secret=SECRET)])
    try:
        n.notify("decision", "g1", "candidate 3 approved by alice", {"candidate_id": 3})
        receiver.wait(lambda b: len(b) == 1)
    finally:
        n.close()
    _, headers, raw = receiver.raw[0]
    assert headers["X-Tuneloop-Signature"].startswith("v1=") and headers["X-Tuneloop-Timestamp"].isdigit()
    assert verify(SECRET, headers, raw)
    assert not verify(SECRET, headers, raw.replace(b"approved", b"rejected"))  # tampered body
    assert not verify("another-secret-000", headers, raw)  # wrong secret
    assert not verify(SECRET, {**headers, "X-Tuneloop-Timestamp": str(int(headers["X-Tuneloop-Timestamp"]) + 1)}, raw)
    assert not verify(SECRET, headers, raw, now=int(headers["X-Tuneloop-Timestamp"]) + 3600)  # a replay, much later
    assert SECRET.encode() not in raw and json.loads(raw)["text"] == "candidate 3 approved by alice"


def test_without_a_secret_nothing_is_signed(receiver):
    n = Notifier([Webhook(url=receiver.url + "/hook", format="feishu")])
    try:
        n.notify("stopped", "g1", "done")
        receiver.wait(lambda b: len(b) == 1)
    finally:
        n.close()
    _, headers, raw = receiver.raw[0]
    assert "X-Tuneloop-Signature" not in headers and json.loads(raw) == payload("feishu", "stopped", "g1", "done")

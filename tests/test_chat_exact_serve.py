"""Against a real `tuneloop serve` with Slack and Feishu configured (issue 44's must-hold): every message of the
table that is not exactly a command, and every message of the held-back table, sent through the REST chat, a
signed Slack slash command and a signed, encrypted Feishu message, leaves the waiting candidate waiting and the
goal neither paused nor stopped; `approve N` then approves it. Slack's `ssl_check` gets 200 with an empty body."""
from __future__ import annotations

import json
from urllib.parse import urlencode

import httpx
import pytest
from chat_heldback import HELD_BACK
from chat_table import NOT_COMMANDS
from chatops_support import Platform, env, feishu_request, message_event, slack_headers, slash
from test_api_support import ServerProcess, auth, service_env, small_goal, wait_until

from api.chat import parse
from core.escape import feishu_post_text


@pytest.fixture
def served(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    platform = Platform()
    extra = {k: v for k, v in env(tmp_path, platform).items() if k not in ("TUNELOOP_DB", "TUNELOOP_RUNS_ROOT")}
    srv = ServerProcess(tmp_path, service_env(tmp_path, f"sqlite:///{tmp_path / 't.db'}", **extra))
    try:
        yield srv, platform
    finally:
        srv.stop()
        platform.close()


def test_no_message_but_an_exact_command_acts_through_rest_slack_and_feishu(served):
    srv, platform = served
    http = httpx.Client(base_url=srv.url, timeout=60)
    gid = http.post("/goals", json=small_goal(experiments=3), headers=auth("admin")).json()["id"]
    n = wait_until(lambda: http.get(f"/goals/{gid}/candidates?awaiting=true", headers=auth("viewer")).json())[0]["id"]
    messages = [t.format(n=n, m=n + 1) for t in NOT_COMMANDS + HELD_BACK]
    assert len(messages) >= 370
    for text in messages:
        r = http.post(f"/goals/{gid}/chat", json={"text": text}, headers=auth("approver"))
        assert r.status_code == 200 and r.json()["action"] is None and r.json()["reply"].startswith("not done"), text
        body = slash("UALICE", text, platform)
        r = http.post("/chatops/slack/commands", content=body, headers=slack_headers(body))
        assert r.status_code == 200 and r.json()["response_type"] == "ephemeral", (text, r.text)
        assert r.json()["text"].startswith("not done"), (text, r.json())
        body, headers = feishu_request(message_event("ou_fay", text))
        assert http.post("/chatops/feishu/events", content=body, headers=headers).status_code == 200, text
    replies = platform.wait(lambda c: c["path"] == "/open-apis/im/v1/messages" and c["body"]["msg_type"] == "post",
                            len(messages))
    said = [feishu_post_text(json.loads(c["body"]["content"])) for c in replies]
    assert all(s.startswith("not done") for s in said), [s for s in said if not s.startswith("not done")][:3]
    # nothing decided, nothing instructed: the candidate still waits and the goal is neither paused nor stopped
    assert http.get(f"/candidates/{n}/approval", headers=auth("viewer")).json() is None
    assert http.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json() == []
    assert http.get(f"/goals/{gid}", headers=auth("viewer")).json()["status"] == "waiting"
    assert n in [c["id"] for c in http.get(f"/goals/{gid}/candidates?awaiting=true", headers=auth("viewer")).json()]
    # a near miss is offered the card it may have meant, with its buttons bound to the hash the loop showed
    shown = next(c for c in http.get(f"/goals/{gid}/candidates?awaiting=true", headers=auth("viewer")).json()
                 if c["id"] == n)["card_hash"]
    body = slash("UALICE", f"approve {n} later", platform)
    r = http.post("/chatops/slack/commands", content=body, headers=slack_headers(body)).json()
    assert f"'approve {n}'" in r["text"] and f"{n}:{shown}" in json.dumps(r["blocks"])
    assert not [b for b in (slash("UALICE", f"don't approve {n}", platform),)
                if "blocks" in http.post("/chatops/slack/commands", content=b, headers=slack_headers(b)).json()]
    body, headers = feishu_request(message_event("ou_fay", f"批准 {n} 吗"))
    http.post("/chatops/feishu/events", content=body, headers=headers)
    # every Feishu message that meant "approve N" (and this one) was offered the card; the first is the loop's ask
    meant = sum(parse(t).suggest == f"approve {n}" for t in messages) + 1
    assert meant > 100
    offered = platform.wait(lambda c: c["path"] == "/open-apis/im/v1/messages" and c["body"]["msg_type"] == "interactive"
                            and f'"card_hash": "{shown}"' in c["body"]["content"], 1 + meant)
    assert len(offered) == 1 + meant
    assert http.get(f"/candidates/{n}/approval", headers=auth("viewer")).json() is None  # an offer does nothing
    body = slash("UALICE", f"approve {n}", platform)
    r = http.post("/chatops/slack/commands", content=body, headers=slack_headers(body))
    assert r.json()["response_type"] == "in_channel" and f"candidate {n}" in r.json()["text"], r.text
    ap = http.get(f"/candidates/{n}/approval", headers=auth("viewer")).json()
    assert (ap["decision"], ap["who"]) == ("approve", "alice (slack)")


def test_slack_ssl_check_is_answered_as_slack_documents(served):
    """Slack POSTs ssl_check=1 (unsigned) to a slash command's URL to check its certificate: 200, empty body."""
    srv, _ = served
    r = httpx.post(f"{srv.url}/chatops/slack/commands", content=urlencode({"ssl_check": "1", "token": "legacy"}),
                   headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=60)
    assert r.status_code == 200 and r.content == b""
    # anything else unsigned is still refused
    r = httpx.post(f"{srv.url}/chatops/slack/commands", content=urlencode({"ssl_check": "1", "text": "approve 1"}),
                   headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=60)
    assert r.status_code == 401

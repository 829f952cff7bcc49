"""One validator for a person's reason (issue 44, state/reasons.py): blank, punctuation-only and emoji-only reasons
are refused with the same words by REST, the dashboard, the chat, Slack, Feishu and the CLI; where a decision or
an instruction came from is recorded (api, dashboard, chat, slack, feishu, cli)."""
from __future__ import annotations

import subprocess
import sys

import pytest
from chatops_support import block_actions, card_click, feishu_request
from test_api_support import ROOT, auth, small_goal, wait_until
from test_chat import client, say  # noqa: F401  (client: the API with a sqlite store)
from test_chatops import INTERACT, FEISHU_CARD, ephemeral, live, next_card, platform, post_slack  # noqa: F401

from state.reasons import NO_REASON

NOTHING = ["", "   ", "...", "?!", "—", "👎", "🙅‍♀️🙅", "。。。", "___", "👍 !"]


def _waiting(c, gid):
    return wait_until(lambda: c.get(f"/goals/{gid}/candidates?awaiting=true", headers=auth("viewer")).json())[0]


def test_rest_dashboard_and_chat_refuse_a_reason_that_says_nothing_with_the_same_words(client):  # noqa: F811
    c = client
    gid = c.post("/goals", json=small_goal(experiments=3), headers=auth("admin")).json()["id"]
    cand = _waiting(c, gid)
    for reason in NOTHING:
        for headers in (auth("approver"), auth("approver") | {"X-Tuneloop-Client": "dashboard"}):
            r = c.post(f"/candidates/{cand['id']}/reject", json={"card_hash": cand["card_hash"], "reason": reason},
                       headers=headers)
            assert r.status_code == 422 and NO_REASON in r.text, (reason, r.text)
        if reason.strip():
            r = c.post(f"/candidates/{cand['id']}/approve", json={"card_hash": cand["card_hash"], "reason": reason},
                       headers=auth("approver"))
            assert r.status_code == 422 and NO_REASON in r.text, (reason, r.text)
            out = say(c, gid, f"reject {cand['id']} because {reason}")
            assert out["action"] is None and NO_REASON in out["reply"], (reason, out)
        r = c.post(f"/goals/{gid}/budget/extensions/refuse", json={"reason": reason}, headers=auth("approver"))
        assert r.status_code == 422 and NO_REASON in r.text, (reason, r.text)
    assert c.get(f"/candidates/{cand['id']}/approval", headers=auth("viewer")).json() is None
    r = c.post(f"/candidates/{cand['id']}/approve", json={"card_hash": cand["card_hash"]},
               headers=auth("approver") | {"X-Tuneloop-Client": "dashboard"})
    assert r.status_code == 200 and r.json()["who"] == "approver1 (dashboard)"
    r = c.post(f"/goals/{gid}/pause", headers=auth("approver") | {"X-Tuneloop-Client": "something else"})
    assert r.json()["who"] == "approver1 (api)"  # a label from a fixed list, never the header's text


def test_slack_and_feishu_refuse_it_with_the_same_words(live, platform):  # noqa: F811
    live.http.post("/goals", json=small_goal(experiments=3), headers=auth("admin"))
    cid, value = next_card(platform)
    r = post_slack(live, INTERACT, block_actions(platform, "UALICE", "tuneloop_reject", value, reason="👎👎"))
    assert r.status_code == 200 and NO_REASON in ephemeral(platform, 1)
    shown = value.split(":")[1]
    body, headers = feishu_request(card_click("ou_fay", {"tuneloop": "reject", "candidate_id": str(cid),
                                                         "card_hash": shown}, reason="..."))
    r = live.http.post(FEISHU_CARD, content=body, headers=headers).json()
    assert r["toast"]["type"] == "error" and NO_REASON in r["toast"]["content"]
    assert live.store.approval(cid) is None


@pytest.mark.parametrize("reason", ["🤷", "...", " "])
def test_the_cli_refuses_it_with_the_same_words(tmp_path, reason):
    out = subprocess.run([sys.executable, "-m", "tuneloop_cli", "approve", "1", "--reject", "--reason", reason,
                          "--db", f"sqlite:///{tmp_path / 't.db'}"], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "300"})
    assert out.returncode != 0 and NO_REASON in " ".join(out.stderr.split()), out.stderr

"""Slack and Feishu/Lark approvals over real HTTP: the loop's card is posted to a local server standing in for the
platform's API, and callbacks signed (and encrypted) exactly as the platforms sign them decide it. A bad signature,
a stale timestamp, a replay, an unknown user, a viewer, a second click and a click on a changed card are each
refused, change nothing (the store's approval is unchanged) and say why."""
from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from chatops_support import (
    FEISHU_TOKEN,
    SLACK_TOKEN,
    Live,
    Platform,
    block_actions,
    card_click,
    env,
    feishu_request,
    message_event,
    slack_headers,
    slash,
    view_submission,
)
from test_api_support import auth, small_goal

from api.app import create_app
from core.escape import feishu_post_text
from api.chatops.slack import SlackApp
from api.settings import Settings

INTERACT, COMMANDS = "/chatops/slack/interactivity", "/chatops/slack/commands"
FEISHU_CARD, FEISHU_EVENTS = "/chatops/feishu/card", "/chatops/feishu/events"


@pytest.fixture
def platform():
    p = Platform()
    yield p
    p.close()


@pytest.fixture
def live(tmp_path, monkeypatch, platform):
    monkeypatch.chdir(tmp_path)
    srv = Live(create_app(Settings.from_env(env(tmp_path, platform))))
    yield srv
    srv.close()


def start_goal(live: Live) -> str:
    r = live.http.post("/goals", json=small_goal(experiments=3), headers=auth("admin"))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def slack_cards(platform: Platform, count: int = 1) -> list[dict]:
    return [c["body"] for c in platform.wait(lambda c: c["path"] == "/api/chat.postMessage", count)]


def buttons(blocks: list[dict]) -> dict[str, str]:
    return {e["action_id"]: e["value"] for b in blocks if b["type"] == "actions" for e in b["elements"]}


def next_card(platform: Platform, *seen: int) -> tuple[int, str]:
    """(candidate id, button value) of the first card posted for a candidate not in `seen` (the next question)."""
    def new(c: dict) -> bool:
        value = buttons(c["body"].get("blocks", [])).get("tuneloop_approve")
        return c["path"] == "/api/chat.postMessage" and value is not None and int(value.split(":")[0]) not in seen
    value = buttons(platform.wait(new)[0]["body"]["blocks"])["tuneloop_approve"]
    return int(value.split(":")[0]), value


def said(blocks: list[dict]) -> str:
    return json.dumps(blocks, ensure_ascii=False)


def state(live: Live, cid: int) -> tuple:
    """What a refusal must leave alone while the loop waits: the card's approval and status."""
    return decision(live, cid), live.store.get_candidate(cid).status


def decision(live: Live, cid: int) -> tuple | None:
    """The recorded decision (once decided the loop moves the card's status on by itself)."""
    ap = live.store.approval(cid)
    return ap and (ap.decision, ap.who, ap.reason, ap.card_hash, ap.created_at)


def post_slack(live: Live, path: str, body: bytes, **kw) -> object:
    return live.http.post(path, content=body, headers=slack_headers(body, **kw))


def ephemeral(platform: Platform, n: int) -> str:
    """The n-th message posted to response_url that only the clicker sees."""
    got = platform.wait(lambda c: c["path"].startswith("/response/")
                        and c["body"].get("response_type") == "ephemeral", n)
    return got[n - 1]["body"]["text"]


def test_slack_card_is_posted_and_a_signed_click_approves_refusals_change_nothing(live, platform):
    start_goal(live)
    card = slack_cards(platform)[0]
    call = platform.to("/api/chat.postMessage")[0]
    assert call["headers"]["Authorization"] == f"Bearer {SLACK_TOKEN}" and card["channel"] == "C0TUNING"
    value = buttons(card["blocks"])["tuneloop_approve"]
    cid, shown = int(value.split(":")[0]), value.split(":")[1]
    text = said(card["blocks"])
    for field in ("what changes (knobs)", "mechanism", "predicted effect", "interval", "evidence", "cost", "rank",
                  "card hash", shown):
        assert field in text, field
    assert buttons(card["blocks"]) == {"tuneloop_approve": value, "tuneloop_reject": value}
    assert any(b["type"] == "input" for b in card["blocks"])  # the reason a Reject takes
    before = state(live, cid)
    assert before[0] is None

    click = block_actions(platform, "UALICE", "tuneloop_approve", value)
    r = live.http.post(INTERACT, content=click, headers=slack_headers(click, secret="not-the-signing-secret"))
    assert r.status_code == 401 and "X-Slack-Signature" in r.json()["detail"]
    old = int(time.time()) - 600
    r = post_slack(live, INTERACT, click, ts=old)
    assert r.status_code == 401 and "s old; requests more than 300 s from now are refused" in r.json()["detail"]
    r = live.http.post(INTERACT, content=click, headers={**slack_headers(click), "X-Slack-Signature": ""})
    assert r.status_code == 401
    assert state(live, cid) == before

    r = post_slack(live, INTERACT, block_actions(platform, "UNOBODY", "tuneloop_approve", value))
    assert r.status_code == 200 and "UNOBODY is not mapped" in ephemeral(platform, 1)
    r = post_slack(live, INTERACT, block_actions(platform, "UVERA", "tuneloop_approve", value))
    assert r.status_code == 200 and "vera has role viewer; candidate.approve needs approver" in ephemeral(platform, 2)
    assert state(live, cid) == before

    headers = slack_headers(click)
    r = live.http.post(INTERACT, content=click, headers=headers)
    assert r.status_code == 200
    ap = live.store.approval(cid)
    assert (ap.decision, ap.who, ap.card_hash) == ("approve", "alice (slack)", shown)
    done = platform.wait(lambda c: c["path"] == "/response/1" and c["body"].get("replace_original") is True)[0]
    shown_now = said(done["body"]["blocks"])
    assert "Approved by alice (slack)" in shown_now and "tuneloop_approve" not in shown_now
    after = decision(live, cid)

    r = live.http.post(INTERACT, content=click, headers=headers)  # the same request again: a replay
    assert r.status_code == 403 and "replayed" in r.json()["detail"]
    second = block_actions(platform, "UALICE", "tuneloop_reject", value, reason="changed my mind")
    assert post_slack(live, INTERACT, second).status_code == 200
    assert "already approved by alice (slack)" in ephemeral(platform, 3)
    assert decision(live, cid) == after


def test_slack_reject_modal_slash_command_and_a_changed_card(live, platform):
    gid = start_goal(live)
    first, value1 = next_card(platform)  # the reference: approved (rejecting it would end the goal)
    assert post_slack(live, INTERACT, block_actions(platform, "UALICE", "tuneloop_approve", value1)).status_code == 200
    cid, value = next_card(platform, first)
    assert post_slack(live, INTERACT, block_actions(platform, "UVERA", "tuneloop_reject", value)).status_code == 200
    assert "candidate.reject needs approver" in ephemeral(platform, 1) and not platform.to("/api/views.open")
    r = post_slack(live, INTERACT, block_actions(platform, "UALICE", "tuneloop_reject", value))  # no reason typed
    assert r.status_code == 200
    modal = platform.wait(lambda c: c["path"] == "/api/views.open")[0]["body"]
    assert modal["view"]["callback_id"] == "tuneloop_reject" and live.store.approval(cid) is None
    meta = modal["view"]["private_metadata"]
    r = post_slack(live, INTERACT, view_submission("UVERA", meta, "not by a viewer"))
    assert r.status_code == 200 and "needs approver" in r.json()["errors"]["tuneloop_reason"]
    assert live.store.approval(cid) is None
    r = post_slack(live, INTERACT, view_submission("UALICE", meta, "not worth a restart now"))
    assert r.status_code == 200 and not r.content
    ap = live.store.approval(cid)
    assert (ap.decision, ap.who, ap.reason) == ("reject", "alice (slack)", "not worth a restart now")
    upd = platform.wait(lambda c: c["path"] == "/api/chat.update")[0]["body"]
    assert (upd["channel"], upd["ts"]) == ("C0TUNING", "1700000000.000100")
    assert "Rejected by alice (slack), bound to card hash" in said(upd["blocks"])

    r = post_slack(live, COMMANDS, slash("UVERA", "status", platform))  # a viewer may ask
    assert r.status_code == 200 and r.json()["response_type"] == "ephemeral" and gid in r.json()["text"]
    cid2, value2 = next_card(platform, first, cid)
    shown2 = value2.split(":")[1]
    r = post_slack(live, COMMANDS, slash("UVERA", f"approve {cid2}", platform))
    assert "candidate.approve needs approver" in r.json()["text"] and live.store.approval(cid2) is None

    changed = live.store.update_card(cid2, {**live.store.get_candidate(cid2).card, "note": "edited after it was shown"})
    before = state(live, cid2)
    assert post_slack(live, INTERACT, block_actions(platform, "UALICE", "tuneloop_approve", value2)).status_code == 200
    assert f"hash {shown2} -> {changed.card_hash}" in ephemeral(platform, 2)
    r = post_slack(live, COMMANDS, slash("UALICE", f"approve {cid2}", platform))  # the same binding as the REST chat
    assert r.status_code == 200 and "changed since it was shown" in r.json()["text"]
    assert state(live, cid2) == before
    r = post_slack(live, COMMANDS, slash("UALICE", f"{gid} reject {cid2} {changed.card_hash} because it was edited",
                                         platform))
    assert r.json()["response_type"] == "in_channel" and "rejected by alice" in r.json()["text"]
    assert live.store.approval(cid2).who == "alice (slack)"


def test_feishu_card_is_posted_and_a_signed_encrypted_click_approves_refusals_change_nothing(live, platform):
    start_goal(live)
    sent = platform.wait(lambda c: c["path"] == "/open-apis/im/v1/messages")[0]
    assert sent["query"] == {"receive_id_type": ["chat_id"]}
    assert sent["headers"]["Authorization"] == "Bearer t-tenant-token"
    assert sent["body"]["receive_id"] == "oc_tuning" and sent["body"]["msg_type"] == "interactive"
    card = json.loads(sent["body"]["content"])
    form = next(e for e in card["body"]["elements"] if e["tag"] == "form")
    values = {b["name"]: b["behaviors"][0]["value"] for b in form["elements"] if b["tag"] == "button"}
    assert {e["tag"] for e in form["elements"]} == {"input", "button"} and set(values) == {"approve", "reject"}
    cid, shown = int(values["approve"]["candidate_id"]), values["approve"]["card_hash"]
    text = json.dumps(card, ensure_ascii=False)
    for field in ("predicted effect", "interval", "evidence", "hypothesis", "card hash", shown):
        assert field in text, field

    body, headers = feishu_request({"type": "url_verification", "challenge": "c-123", "token": FEISHU_TOKEN})
    r = live.http.post(FEISHU_EVENTS, content=body, headers=headers)
    assert r.status_code == 200 and r.json() == {"challenge": "c-123"}
    body, headers = feishu_request({"type": "url_verification", "challenge": "c-123", "token": "wrong"})
    assert live.http.post(FEISHU_EVENTS, content=body, headers=headers).status_code == 401

    before = state(live, cid)
    assert before[0] is None
    body, headers = feishu_request(card_click("ou_fay", values["approve"]), sign_key="another-key")
    r = live.http.post(FEISHU_CARD, content=body, headers=headers)
    assert r.status_code == 401 and "X-Lark-Signature" in r.json()["detail"]
    body, headers = feishu_request(card_click("ou_fay", values["approve"]), ts=int(time.time()) - 600)
    r = live.http.post(FEISHU_CARD, content=body, headers=headers)
    assert r.status_code == 401 and "old" in r.json()["detail"]
    body, headers = feishu_request(card_click("ou_fay", values["approve"], token="not-the-token"))
    assert live.http.post(FEISHU_CARD, content=body, headers=headers).status_code == 401
    body, headers = feishu_request(card_click("ou_fay", values["approve"]), key="another-key")
    r = live.http.post(FEISHU_CARD, content=body, headers=headers)
    assert r.status_code == 401 and "decrypted" in r.json()["detail"]
    for who, why in (("ou_nobody", "ou_nobody is not mapped"), ("ou_vic", "vic has role viewer")):
        body, headers = feishu_request(card_click(who, values["approve"]))
        r = live.http.post(FEISHU_CARD, content=body, headers=headers)
        assert r.status_code == 200 and r.json()["toast"]["type"] == "error" and why in r.json()["toast"]["content"]
    body, headers = feishu_request(card_click("ou_fay", values["reject"]))  # no reason in the form
    assert "say why" in live.http.post(FEISHU_CARD, content=body, headers=headers).json()["toast"]["content"]
    assert state(live, cid) == before

    body, headers = feishu_request(card_click("ou_fay", values["approve"]))
    r = live.http.post(FEISHU_CARD, content=body, headers=headers)
    assert r.status_code == 200 and r.json()["toast"]["type"] == "success"
    outcome = r.json()["card"]["data"]
    assert "Approved by fay (feishu)" in json.dumps(outcome)
    assert all(e["tag"] != "form" for e in outcome["body"]["elements"])
    ap = live.store.approval(cid)
    assert (ap.decision, ap.who, ap.card_hash) == ("approve", "fay (feishu)", shown)
    after = decision(live, cid)
    r = live.http.post(FEISHU_CARD, content=body, headers=headers)
    assert r.status_code == 403 and "replayed" in r.json()["detail"]
    body, headers = feishu_request(card_click("ou_fay", values["reject"], reason="second thoughts"))
    r = live.http.post(FEISHU_CARD, content=body, headers=headers).json()
    assert "already approved by fay (feishu)" in r["toast"]["content"] and "Approved by fay" in json.dumps(r["card"])
    assert decision(live, cid) == after

    def later_card(c: dict) -> bool:
        return (c["path"] == "/open-apis/im/v1/messages" and c["body"]["msg_type"] == "interactive"
                and f'"candidate_id": "{cid}"' not in c["body"]["content"])
    nxt = json.loads(platform.wait(later_card)[0]["body"]["content"])
    form = next(e for e in nxt["body"]["elements"] if e["tag"] == "form")
    reject = next(b["behaviors"][0]["value"] for b in form["elements"] if b.get("name") == "reject")
    body, headers = feishu_request(card_click("ou_fay", reject, reason="not worth a restart now"))
    r = live.http.post(FEISHU_CARD, content=body, headers=headers).json()
    assert r["toast"]["type"] == "success" and "Rejected by fay (feishu)" in r["toast"]["content"]
    ap = live.store.approval(int(reject["candidate_id"]))
    assert (ap.decision, ap.who, ap.reason) == ("reject", "fay (feishu)", "not worth a restart now")


def test_feishu_messages_use_the_chat_grammar_and_a_changed_card_is_refused(live, platform):
    gid = start_goal(live)
    first = platform.wait(lambda c: c["path"] == "/open-apis/im/v1/messages" and c["body"]["msg_type"] == "interactive")
    card = json.loads(first[0]["body"]["content"])
    form = next(e for e in card["body"]["elements"] if e["tag"] == "form")
    value = next(b["behaviors"][0]["value"] for b in form["elements"] if b.get("name") == "approve")
    cid = int(value["candidate_id"])

    def replies(n: int) -> list[str]:
        got = platform.wait(lambda c: c["path"] == "/open-apis/im/v1/messages" and c["body"]["msg_type"] == "post", n)
        posts = [json.loads(c["body"]["content"]) for c in got]
        # plain text only: every element a text tag (no at, a or img a person's words could become)
        assert all(e["tag"] == "text" for p in posts for para in p["zh_cn"]["content"] for e in para), posts
        return [feishu_post_text(p) for p in posts]

    for n, (who, text) in enumerate((("ou_vic", "status"), ("ou_nobody", f"approve {cid}"),
                                     ("ou_vic", f"approve {cid}")), 1):
        body, headers = feishu_request(message_event(who, text))
        r = live.http.post(FEISHU_EVENTS, content=body, headers=headers)
        assert r.status_code == 200 and r.json() == {"msg": "success"}
        got = replies(n)  # each reply is posted after its answer: one at a time keeps their order
    assert gid in got[0] and f"candidate {cid}" in got[0]
    assert "ou_nobody is not mapped" in got[1] and "candidate.approve needs approver" in got[2]
    assert live.store.approval(cid) is None

    changed = live.store.update_card(cid, {**live.store.get_candidate(cid).card, "note": "edited after it was shown"})
    before = state(live, cid)
    body, headers = feishu_request(card_click("ou_fay", value))
    r = live.http.post(FEISHU_CARD, content=body, headers=headers).json()
    assert r["toast"]["type"] == "error" and "changed since it was shown" in r["toast"]["content"]
    assert state(live, cid) == before
    body, headers = feishu_request(message_event("ou_fay", f"拒绝 {cid} {changed.card_hash} 因为 卡片被改过"))
    assert live.http.post(FEISHU_EVENTS, content=body, headers=headers).status_code == 200
    assert f"candidate {cid}" in replies(4)[3]
    ap = live.store.approval(cid)
    assert (ap.decision, ap.who, ap.reason) == ("reject", "fay (feishu)", "卡片被改过")


def test_without_settings_the_routes_exist_and_refuse(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Settings.from_env({"TUNELOOP_DB": f"sqlite:///{tmp_path / 't.db'}", "TUNELOOP_WORKERS": "0"})
    srv = Live(create_app(s))
    try:
        for path in (INTERACT, COMMANDS, FEISHU_CARD, FEISHU_EVENTS):
            r = srv.http.post(path, content=b"payload=%7B%7D")
            assert r.status_code == 403 and "not configured" in r.json()["detail"], path
        assert not srv.app.state.service.notifier.sinks  # nothing to post to
        assert not any("chatops" in p for p in srv.http.get("/openapi.json").json()["paths"])
    finally:
        srv.close()


def test_settings_map_chat_users_and_keep_secrets_out_of_sight(tmp_path):
    f = tmp_path / "users.yaml"
    f.write_text("- {platform: feishu, user: ou_abc, name: bob, role: admin}\n")
    s = Settings.from_env({"TUNELOOP_CHAT_USERS": "slack:U1:alice:approver", "TUNELOOP_CHAT_USERS_FILE": str(f),
                           "TUNELOOP_SLACK_SIGNING_SECRET": "sss-0123456789",
                           "TUNELOOP_FEISHU_APP_SECRET": "fff-0123456789"})
    assert [(u.platform, u.user, u.name, u.role) for u in s.chat_users] == [
        ("feishu", "ou_abc", "bob", "admin"), ("slack", "U1", "alice", "approver")]
    assert {"sss-0123456789", "fff-0123456789"} <= set(s.secrets) and "sss-0123456789" not in repr(s)
    with pytest.raises(ValueError, match="mapped twice: slack:U1"):
        Settings.from_env({"TUNELOOP_CHAT_USERS": "slack:U1:alice:approver,slack:U1:bob:viewer"})
    with pytest.raises(ValueError, match="chat_users.0.role"):
        Settings.from_env({"TUNELOOP_CHAT_USERS": "slack:U1:alice:owner"})
    with pytest.raises(ValueError, match="feishu_domain"):
        Settings.from_env({"TUNELOOP_FEISHU_DOMAIN": "http://open.feishu.cn"})
    app = SlackApp(Settings(slack_api_url="http://127.0.0.1:9/api/"))  # response_url: Slack's host or the API's only
    assert app.response_url("https://hooks.slack.com/actions/T/1/x") and app.response_url("http://127.0.0.1:9/r/1")
    assert app.response_url("https://attacker.example/steal") is None
    assert app.response_url("http://127.0.0.1:10/r") is None


# ---- no input answers 5xx: what schemathesis does for the documented routes, for these undocumented ones ------
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                     max_leaves=12)
_KEYS = ("type", "user", "actions", "view", "trigger_id", "text", "user_id", "command", "event", "header",
         "challenge", "token", "schema", "action", "value", "operator", "encrypt")
_SHAPED = st.dictionaries(st.sampled_from(_KEYS), _JSON, max_size=6)  # near the real payloads' shape


@pytest.fixture(scope="module")
def fuzz_client(tmp_path_factory):
    from fastapi.testclient import TestClient

    tmp = tmp_path_factory.mktemp("chatops-fuzz")

    class Nowhere:  # no card is ever posted here: fuzzed callbacks decide nothing that asks
        url = "http://127.0.0.1:9"

    with TestClient(create_app(Settings.from_env(env(tmp, Nowhere(), TUNELOOP_WORKERS="0")))) as c:
        yield c


@hsettings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from((INTERACT, COMMANDS, FEISHU_CARD, FEISHU_EVENTS)), shaped=_SHAPED,
       raw=st.binary(max_size=200), how=st.sampled_from(("raw", "form", "signed form", "signed json", "encrypted")))
def test_no_body_signed_or_not_gets_a_5xx(fuzz_client, route, shaped, raw, how):
    """Random bytes, forms and JSON near the platforms' payload shapes, unsigned, validly signed (Slack) or
    encrypted and signed (Feishu): each is answered below 500 (refused, or a reply saying what was wrong)."""
    from urllib.parse import urlencode

    if how == "raw":
        body, headers = raw, {"Content-Type": "application/octet-stream"}
    elif how in ("form", "signed form"):
        body = urlencode({"payload": json.dumps(shaped)} if route == INTERACT else
                         {k: json.dumps(v) if not isinstance(v, str) else v for k, v in shaped.items()}).encode()
        headers = slack_headers(body) if how == "signed form" else {"Content-Type": "application/x-www-form-urlencoded"}
    elif how == "signed json":
        body = json.dumps(shaped).encode()
        headers = slack_headers(body) | {"Content-Type": "application/json"}
    else:
        body, headers = feishu_request(shaped)
    r = fuzz_client.post(route, content=body, headers=headers)
    assert r.status_code < 500, (route, how, r.status_code, r.text[:300])

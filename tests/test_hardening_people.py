"""Nothing a person sends is stretched, leaked or lost (issue 57), each hole through a real `tuneloop serve`: a
person's text escaped in the Slack webhook and in report.md; a budget extension only as the answer to the loop's
ask; no negative infinity turned into the largest rate, no instruction stored other than as validated; a reason that
renders blank refused and a long one judged after folding, alike on REST, chat and the CLI; merge keys counted; who
and via on the decision a pause or a stop made, once; a CSP, no framing and nosniff on every page."""
from __future__ import annotations

import json
import re

import httpx
import pytest
import yaml
from steering_support import ServerProcess, auth, awaiting, get, post, say, service_env, small_goal, tuneloop, \
    wait_until
from test_webhook import Receiver

from state.reasons import MAX_REASON, NO_REASON

EVIL = "no <!channel> <https://evil.example/login|Approve candidate here>"
HTML = "<img src=x onerror=alert(1)> see [the login](https://evil.example/login)"
BLANK = ["\u3164", "\u3164 \u3164", "1\ufe0f\u20e3 0\ufe0f\u20e3", "1\u20e3", "\u200b\u200b", "\uffa0"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("people")
    hook = Receiver()
    db = f"sqlite:///{tmp / 't.db'}"
    s = ServerProcess(tmp, service_env(tmp, db, TUNELOOP_WEBHOOK_URL=f"{hook.url}/slack",
                                       TUNELOOP_WEBHOOK_FORMAT="slack", TUNELOOP_TWIN="off"))
    s.db, s.hook, s.tmp = db, hook, tmp  # type: ignore[attr-defined]
    try:
        yield s
    finally:
        s.stop()
        hook.close()


def _goal(srv, name: str, **kw) -> str:
    return post(srv, "/goals", small_goal(name, **kw), role="admin", code=201).json()["id"]


def _card(srv, gid: str) -> dict:
    return wait_until(lambda: awaiting(srv, gid), what="a card to decide")[0]


def _count(srv) -> int:
    return len(get(srv, "/goals"))


def test_the_slack_webhook_and_report_md_show_a_persons_text_as_text(srv):
    gid = _goal(srv, "escaped")
    card = _card(srv, gid)
    said = f"{EVIL} {HTML}"
    r = post(srv, f"/candidates/{card['id']}/reject", {"card_hash": card["card_hash"], "reason": said}, code=200)
    assert r.json()["reason"] == said  # stored as said
    got = srv.hook.wait(lambda b: any(f"candidate {card['id']} rejected" in x["text"] for x in b))
    sent = next(x for x in got if f"candidate {card['id']} rejected" in x["text"])
    for text in (sent["text"], sent["blocks"][0]["text"]["text"]):  # Slack reads both as mrkdwn
        assert "<!channel>" not in text and "<https://" not in text and "<img" not in text
        assert "&lt;!channel&gt; &lt;https://evil.example/login|Approve candidate here&gt;" in text
    post(srv, f"/goals/{gid}/instructions", {"kind": "resume", "text": f"first line\n# {HTML}\n| a | b |"}, code=201)
    md = httpx.get(f"{srv.url}/goals/{gid}/report.md", headers=auth("viewer"), timeout=120).text
    assert not re.search(r"(?<!\\)[<&]|(?<!\\)\]\(https", md)  # no raw HTML, entity or link: every one escaped
    assert "\\<img src=x onerror=alert(1)\\> see \\[the login\\](https://evil.example/login)" in md
    assert "first line \\# \\<img" in md  # the instruction's text on its own row, its newlines folded
    assert not any(line.startswith(("# \\<", "| a |")) for line in md.splitlines())  # no heading or row of its own
    page = httpx.get(f"{srv.url}/goals/{gid}/report", headers=auth("viewer"), timeout=120).text
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_a_budget_extension_nobody_asked_for_is_refused_on_every_channel_and_nothing_is_stored(srv):
    gid = _goal(srv, "unasked")
    _card(srv, gid)  # waiting, but for a decision on a card: no extension asked
    before = get(srv, f"/goals/{gid}/budget")
    r = post(srv, f"/goals/{gid}/budget/extensions", {"card_hours": 5000, "experiments": 500, "reason": "why not"})
    assert r.status_code == 409 and "not waiting for a budget extension" in r.text, r.text
    r = post(srv, f"/goals/{gid}/chat", {"text": "extend budget by 5000 card-hours and 500 experiments"})
    assert r.status_code == 409 and "not waiting for a budget extension" in r.text, r.text
    out = tuneloop(srv.tmp, "budget", "extend", gid, "--card-hours", "5000", "--experiments", "500", "--db", srv.db)
    assert out.returncode == 1 and "not waiting for a budget extension" in out.stderr, out.stderr
    r = post(srv, f"/goals/{gid}/budget/extensions/refuse", {"reason": "not asked"})
    assert r.status_code == 409
    assert get(srv, f"/goals/{gid}/budget/extensions") == {"asked": None, "extensions": []}
    assert get(srv, f"/goals/{gid}/budget") == before


@pytest.mark.parametrize("raw", ["-Infinity", "-1e400"])
def test_a_negative_infinite_rate_is_refused_in_a_goal_and_an_instruction_and_nothing_is_stored(srv, raw):
    n = _count(srv)
    body = json.dumps(small_goal(f"neg-inf-{raw}") | {"start_knobs": {"request_rate": 0.5}}).replace(
        '"request_rate": 0.5', f'"request_rate": {raw}')
    r = httpx.post(f"{srv.url}/goals", content=body, headers=auth("admin") | {"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == 422 and "request_rate" in r.text and "finite" in r.text, r.text
    g = small_goal(f"neg-inf-yaml-{raw}")
    g["start_knobs"] = {"request_rate": float("-inf")}
    r = httpx.post(f"{srv.url}/goals", content=yaml.safe_dump(g), timeout=60,
                   headers=auth("admin") | {"content-type": "application/yaml"})
    assert r.status_code == 422 and "request_rate" in r.text, r.text
    assert _count(srv) == n
    gid = _goal(srv, f"neg-inf-ins-{raw}")
    body = f'{{"kind": "one_more_round", "knobs": {{"request_rate": {raw}}}}}'
    r = httpx.post(f"{srv.url}/goals/{gid}/instructions", content=body, timeout=60,
                   headers=auth("approver") | {"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "knobs", "request_rate"], r.text
    assert "must be finite, got -inf" in r.text
    assert get(srv, f"/goals/{gid}/instructions") == []
    r = post(srv, f"/goals/{gid}/instructions", {"kind": "one_more_round", "knobs": {"request_rate": "8"}}, code=201)
    assert r.json()["knobs"] == {"request_rate": 8.0}  # stored as validated, not as sent
    assert [i["knobs"] for i in get(srv, f"/goals/{gid}/instructions")] == [{"request_rate": 8.0}]


def test_a_reason_that_renders_blank_is_refused_and_a_long_one_judged_folded_alike_everywhere(srv):
    gid = _goal(srv, "reasons")
    card = _card(srv, gid)
    url = f"/candidates/{card['id']}/reject"
    too_long = "x" * (MAX_REASON + 1)
    cases = [(b, NO_REASON) for b in BLANK] + [(too_long, f"at most {MAX_REASON} characters"),
                                               ("a " + too_long, f"at most {MAX_REASON} characters")]
    for i, (reason, words) in enumerate(cases):
        r = post(srv, url, {"card_hash": card["card_hash"], "reason": reason})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "reason" and words in r.text, r.text
        reply = say(srv, gid, f"reject {card['id']} because {reason}")
        assert reply["action"] is None and words in reply["reply"], (reason, reply)
        if i not in (0, 2, len(BLANK)):  # the CLI (a process start each, ~30 s on a loaded 2-core host) on a filler,
            continue  # a keycap and the long reason: it calls the same validator (test_reason_properties holds them)
        cli = tuneloop(srv.tmp, "approve", str(card["id"]), "--reject", "--reason", reason, "--db", srv.db)
        assert cli.returncode == 2 and words in " ".join(cli.stderr.replace("│", " ").split()), (reason, cli.stderr)
    assert get(srv, f"/candidates/{card['id']}/approval") is None  # nothing recorded
    spaced = "a" + " " * 600 + "b"  # 602 characters as sent, "a b" as judged and stored: accepted on REST as in chat
    r = post(srv, url, {"card_hash": card["card_hash"], "reason": spaced}, code=200)
    assert r.json()["reason"] == "a b"


def test_two_merge_keys_in_one_mapping_are_a_repeated_key(srv):
    n = _count(srv)
    text = yaml.safe_dump(small_goal("merge")).replace(
        "authorisation:\n", "authorisation:\n  <<: {hot: auto}\n  <<: {hot: deny}\n", 1)
    assert text.count("<<:") == 2
    r = httpx.post(f"{srv.url}/goals", content=text, timeout=60,
                   headers=auth("admin") | {"content-type": "application/yaml"})
    assert r.status_code == 422 and "'<<' is repeated" in r.text, r.text
    assert _count(srv) == n


def test_a_pause_and_a_stop_name_who_and_via_on_their_decision_once(srv):
    gid = _goal(srv, "paused", ask=False, experiments=8)
    wait_until(lambda: get(srv, f"/goals/{gid}/experiments"), what="the first experiment")
    post(srv, f"/goals/{gid}/pause", code=200)  # sent while the loop runs: its wake runs the goal once more
    wait_until(lambda: (g := get(srv, f"/goals/{gid}"))["status"] == "paused" and g["worker_state"] == "idle",
               what="the goal to pause and its worker to go idle")
    stops = [d for d in get(srv, f"/goals/{gid}/decisions") if d["kind"] == "stop"]
    assert [(d["text"], d["who"], d["via"]) for d in stops] == [("paused by approver1 (api)", "approver1", "api")]
    say(srv, gid, "resume")
    wait_until(lambda: get(srv, f"/goals/{gid}")["status"] != "paused", what="the goal to resume")
    say(srv, gid, "stop")
    wait_until(lambda: (g := get(srv, f"/goals/{gid}"))["status"] == "stopped" and g["worker_state"] == "idle",
               what="the goal to stop")
    stops = [(d["text"], d["who"], d["via"]) for d in get(srv, f"/goals/{gid}/decisions") if d["kind"] == "stop"]
    assert stops == [("paused by approver1 (api)", "approver1", "api"),
                     ("stopped by approver1 (chat)", "approver1", "chat")], stops


PAGE_HEADERS = ("content-security-policy", "x-frame-options", "x-content-type-options")


def test_every_page_has_a_csp_no_framing_and_nosniff_and_the_api_docs_are_public_as_documented(srv):
    gid = _goal(srv, "pages")
    pages = {"/": {}, "/docs": {}, "/redoc": {}, f"/goals/{gid}/report": auth("viewer")}
    for path, headers in pages.items():
        r = httpx.get(srv.url + path, headers=headers, timeout=120)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), (path, r.status_code)
        assert all(h in r.headers for h in PAGE_HEADERS), (path, dict(r.headers))
        csp = r.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in \
            csp.split("script-src")[1].split(";")[0], (path, csp)
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(f"{srv.url}/goals", timeout=30).status_code == 401
    r = httpx.get(f"{srv.url}/openapi.json", timeout=30)  # public, as docs/rest-api.md says: routes, never data
    assert r.status_code == 200 and r.headers["x-content-type-options"] == "nosniff" and gid not in r.text

"""The optional LLM chat mapping against a scripted OpenAI-compatible endpoint (a real local HTTP server
replaying answers): free text maps onto the same intents as the parser, shown back as the exact command and
carried out only when the person sends it; prose, unknown kinds,
bad fields and a failing endpoint fall back to the deterministic parser with a reply that says so."""
from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest
from fastapi.testclient import TestClient
from test_api_support import TOKENS_ENV, auth, reply, serve, small_goal

from api.app import create_app
from api.service import Service
from api.settings import Settings
from state.goal import parse_goal


class ScriptedModel:
    """POST /v1/chat/completions answers the next scripted item: a string (the message content) or an int
    (that HTTP status). Keeps every request body it received."""

    def __init__(self) -> None:
        self.script: list[str | int] = []
        self.requests: list[dict] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                item = outer.script.pop(0) if outer.script else 500
                if isinstance(item, int):
                    data, code = json.dumps({"error": {"message": "scripted failure"}}).encode(), item
                else:
                    code = 200
                    data = json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                                       "choices": [{"index": 0, "finish_reason": "stop",
                                                    "message": {"role": "assistant", "content": item}}],
                                       "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                reply(self, code, data)

            def log_message(self, *a: object) -> None:
                pass

        self.server = serve(H)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def model():
    m = ScriptedModel()
    yield m
    m.close()


@pytest.fixture
def client(tmp_path, monkeypatch, model):
    monkeypatch.chdir(tmp_path)
    s = Settings.from_env({"TUNELOOP_TOKENS": TOKENS_ENV, "TUNELOOP_DB": f"sqlite:///{tmp_path / 't.db'}",
                           "TUNELOOP_RUNS_ROOT": str(tmp_path / "runs"), "TUNELOOP_WORKERS": "0",
                           "TUNELOOP_LLM_BASE_URL": model.url, "TUNELOOP_LLM_MODEL": "intent-mapper",
                           "TUNELOOP_LLM_API_KEY": "sk-llm-secret-0123456789"})
    svc = Service.open(s)
    with TestClient(create_app(service=svc)) as c:
        yield c
    svc.close()


def say(c, gid: str, text: str) -> dict:
    r = c.post(f"/goals/{gid}/chat", json={"text": text}, headers=auth("approver"))
    assert r.status_code == 200, r.text
    return r.json()


def test_free_text_maps_onto_the_same_intents_and_actions(client, model):
    c = client
    gid = c.app.state.service.store.create_goal(parse_goal(small_goal("llm-chat"))).id
    model.script = ['{"kind": "one_more_round", "count": 2, "knobs": {"concurrency": 90}, "candidate_id": null}',
                    '```json\n{"kind": "pause"}\n```']
    out = say(c, gid, "could you squeeze in a couple more tries with ninety clients in flight")
    assert out["via"] == "llm" and out["intent"] == {"kind": "one_more_round", "count": 2, "knobs": {"concurrency": 90}}
    # the model's reading is shown back as the exact command; nothing is done until the person sends it
    assert out["action"] is None and "'2 more rounds at C90'" in out["reply"] and "Nothing is done yet" in out["reply"]
    assert c.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json() == []
    out = say(c, gid, "2 more rounds at C90")  # confirmed: the parser reads it, the model is not asked again
    assert out["via"] == "parser" and len(model.requests) == 1
    ins = c.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json()[-1]
    assert (ins["kind"], ins["count"], ins["knobs"], ins["who"]) == ("one_more_round", 2, {"concurrency": 90}, "approver1 (chat)")
    assert "2 more round(s) at concurrency=90" in out["reply"]
    out = say(c, gid, "let everything rest a moment, I need to look at the cluster")
    assert out["via"] == "llm" and out["action"] is None and "'pause'" in out["reply"]
    assert c.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json()[-1]["id"] == ins["id"]
    assert say(c, gid, "pause")["action"]["instruction"] > ins["id"]
    assert c.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json()[-1]["kind"] == "pause"
    # the model got the user's text and the mapping prompt, with the configured model and key
    req = model.requests[0]
    assert req["model"] == "intent-mapper" and req["messages"][1]["content"].startswith("could you squeeze")
    assert "restore_best" in req["messages"][0]["content"]


def test_free_text_approval_is_bound_to_the_card_and_records_who(client, model):
    c = client
    st = c.app.state.service.store
    gid = st.create_goal(parse_goal(small_goal("llm-chat"))).id
    card = st.add_candidate(gid, {"stage": "screen", "n": 40, "change": {"knob": "max_prefill_reqs", "old": 1, "new": 2},
                                  "cost_class": "restart"})
    st.set_goal_status(gid, "waiting", f"waiting for approval of candidate {card.id}")  # only a card asked about
    model.script = [json.dumps({"kind": "approve", "candidate_id": card.id})]
    # free text that names no command word and no candidate goes to the model (one that does is the parser's:
    # it is refused with the exact command it may have meant, tests/test_chat_grammar.py)
    out = say(c, gid, "yes, the prefill-cap card is fine by me")
    assert out["via"] == "llm" and out["action"] is None and f"'approve {card.id}'" in out["reply"]
    assert st.approval(card.id) is None  # a model's reading never approves by itself
    out = say(c, gid, f"approve {card.id}")
    assert out["via"] == "parser" and out["action"] == {"candidate_id": card.id, "decision": "approve"}
    ap = st.approval(card.id)
    assert (ap.decision, ap.who, ap.card_hash) == ("approve", "approver1 (chat)", card.card_hash)


def test_text_the_parser_understands_never_reaches_the_model(client, model):
    gid = client.app.state.service.store.create_goal(parse_goal(small_goal("llm-chat"))).id
    out = say(client, gid, "暂停")
    assert out["via"] == "parser" and out["intent"]["kind"] == "pause" and model.requests == []


@pytest.mark.parametrize("answer,why", [
    ("Sure! I think you want to approve something, maybe candidate 3?", "was not one of the commands"),
    ('{"kind": "deploy_everything_now"}', "was not one of the commands"),
    ('{"kind": "approve", "candidate_id": -4}', "was not one of the commands"),
    ('["approve", 3]', "was not one of the commands"),
    ('{"kind": "unknown"}', "did not recognise a command either"),
    (500, "could not be asked"),
])
def test_garbage_falls_back_to_the_parser_with_a_clear_reply(client, model, answer, why):
    c = client
    gid = c.app.state.service.store.create_goal(parse_goal(small_goal("llm-chat"))).id
    model.script = [answer, answer]  # the client retries a 5xx once
    out = say(c, gid, "make it go brrr")
    assert out["via"] == "parser" and out["intent"] == {"kind": "unknown"} and out["action"] is None
    assert out["reply"].startswith("I could not map that onto a command: ") and why in out["reply"]
    assert "approve N" in out["reply"]  # the parser's help: what it does understand
    assert c.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json() == []
    assert "sk-llm-secret" not in json.dumps(out)

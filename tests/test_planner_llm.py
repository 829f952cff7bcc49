"""The LLM planner against a scripted OpenAI-compatible endpoint (a real HTTP server in the test)."""
from __future__ import annotations

import json
import threading
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.planner.llm import LLMPlanner
from tests.test_planner import baseline, history, outcome, summary


class Scripted:
    """Replays scripted chat-completion answers: a dict = the proposal as JSON content, an int = HTTP status."""

    def __init__(self, responses: list):
        self.responses = list(responses)
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                owner.requests.append(body)
                nxt = owner.responses.pop(0) if owner.responses else 500
                if isinstance(nxt, int):
                    self.send_response(nxt)
                    self.send_header("content-type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "scripted failure"}}')
                    return
                content = nxt if isinstance(nxt, str) else json.dumps(nxt)
                data = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": content}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def proposal(knob: str, value: str) -> dict:
    return {"hypotheses": [{"name": "prefill_supply", "likelihood": 0.9,
                            "evidence_for": ["P queue non-empty, D waiting zero"], "evidence_against": []}],
            "knob": knob, "value": value, "hypothesis": "prefill_supply",
            "mechanism": "two requests per prefill pass", "decision": "prefill vs decode bottleneck",
            "expected_effect": "+30 %", "negative_rules_out": "per-pass overhead"}


@pytest.fixture
def h():
    # the start measured at both N (the confirm-N reference is taken while the start is warm): the next step is a choice
    return history([outcome(baseline(), summary(), "reference"),
                    outcome(baseline(n=640), summary(n=640, native=185.0), "reference")])


def test_valid_llm_proposal_becomes_an_llm_card(h):
    with Scripted([proposal("max_num_batched_tokens", "16384")]) as srv:
        plan = LLMPlanner(srv.url, max_retries=0).ask(h)
        sent = srv.requests[0]
    assert plan.fallback is None and plan.card is not None and plan.card.planner == "llm"
    assert (plan.card.change.knob, plan.card.change.new) == ("max_num_batched_tokens", 16384)
    assert plan.card.mechanism == "two requests per prefill pass"
    assert sent["response_format"]["type"] == "json_schema"  # structured output was asked for
    user = sent["messages"][1]["content"]
    assert "prefill_waiting_nonzero_share" in user and "max_prefill_reqs" in user


@pytest.mark.parametrize("bad, why", [
    (proposal("no_such_knob", "2"), "invalid proposal"),
    (proposal("max_prefill_reqs", "3"), "in_range"),  # in the catalog's range, not in the goal's space
    (proposal("speculative_method", "none"), "dependencies"),  # the start's draft width k=3 needs a method
    ("this is not json", "LLM error"),
    (500, "LLM error"),
])
def test_invalid_proposal_or_error_falls_back_and_records_why(h, bad, why):
    with Scripted([bad]) as srv:
        plan = LLMPlanner(srv.url, max_retries=0).ask(h)
    assert plan.fallback is not None and why in plan.fallback
    assert plan.card is not None and plan.card.planner == "deterministic"
    assert plan.card.change.knob == "max_prefill_reqs"  # the rules' own first choice


def test_protocol_steps_never_ask_the_model():
    with Scripted([]) as srv:
        plan = LLMPlanner(srv.url, max_retries=0).ask(history())
        assert srv.requests == []
    assert plan.card is not None and plan.card.stage == "baseline"


def test_the_model_reads_the_same_digest_and_rule_list(tmp_path):
    """System prompt = the registered rules' lines; user prompt = the best station's digest, new evidence included
    (acceptance per draft position, expert load per EP rank, the breakdown's imbalance and draft terms)."""
    from agent.planner import rules
    from tests.rules_support import measured_start

    hm = measured_start(tmp_path, "qwen3-235b-h800-expert-imbalance")
    ref = hm.outcomes[0]
    hm = hm.model_copy(update={"outcomes": [ref, ref.model_copy(update={"card": ref.card.model_copy(update={"n": 640})})]})
    with Scripted([proposal("expert_layout", "static_eplb")]) as srv:
        plan = LLMPlanner(srv.url, max_retries=0).ask(hm)
        sent = srv.requests[0]
    system, user = sent["messages"][0]["content"], sent["messages"][1]["content"]
    for r in rules.RULES:
        assert r.prompt in system
    for key in ("expert_load_spread", "per_rank", "imbalance_s", "draft_s"):
        assert key in user, key
    assert "expert_imbalance [supported" in user  # the deterministic diagnosis, from the same rules
    assert plan.card is not None and plan.card.planner == "llm" and plan.card.change.knob == "expert_layout"
    assert plan.fallback is None


def test_the_summary_shows_a_fallback_note_by_its_record_not_by_its_words(tmp_path):
    """`tuneloop run`'s closing summary lists the LLM planner's fall-backs among the decisions: the note is told
    apart by its record (data.fallback), not by reading "fell back" in its words; other notes stay out."""
    from agent.cli.run import summary_text
    from agent.loop.session import SessionResult
    from state.goal import load_goal
    from state.store import Store

    root = Path(__file__).resolve().parents[1]
    url = f"sqlite:///{tmp_path / 't.db'}"
    st = Store(url)
    try:
        gid = st.create_goal(load_goal(root / "examples" / "goal-16k.yaml")).id
        st.record_decision(gid, "note", text="LLM planner fell back: the endpoint timed out",
                           data={"fallback": "the endpoint timed out"})
        st.record_decision(gid, "note", text="the planner fell back to nothing in particular")  # words alone
    finally:
        st.close()
    text = summary_text(SessionResult(gid, "done", "stopped"), url)
    assert "[note] LLM planner fell back: the endpoint timed out" in text
    assert "nothing in particular" not in text

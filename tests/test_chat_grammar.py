"""Only an exact command acts (issue 44): the table of utterances (tests/chat_table.py), each with its one outcome;
what is not exactly a command is refused with the exact command it may have meant; through the API a refused
message changes nothing and `approve N` then approves; a round at a value the goal cannot take is refused naming
the goal's values."""
from __future__ import annotations

import pytest
from chat_heldback import HELD_BACK
from chat_table import ISSUE, NOT_COMMANDS, REF, rows
from test_api_support import auth, small_goal, wait_until
from test_chat import client, say  # noqa: F401  (client: the API with a sqlite store, as the chat tests use it)

from api.chat import ACTING, Intent, command_text, parse

TABLE = rows()


def test_the_table_is_large_covers_both_languages_and_every_row_of_the_issue():
    assert len({t for t, _, _ in TABLE}) >= 300
    assert sum(1 for t, _, _ in TABLE if any("\u4e00" <= ch <= "\u9fff" for ch in t)) >= 60
    assert sum(1 for t, _, _ in TABLE if "\u2019" in t) >= 10  # the apostrophe phones and macOS type
    assert sum(1 for t, _, _ in TABLE if any("\uff10" <= ch <= "\uff19" for ch in t)) >= 3  # full-width digits
    assert len(ISSUE) == 21 and all(t in NOT_COMMANDS for t in ISSUE)


@pytest.mark.parametrize("text,kind,fields", TABLE, ids=[t or "(empty)" for t, _, _ in TABLE])
def test_each_utterance_has_exactly_its_outcome(text, kind, fields):
    got = parse(text)
    assert got.kind == kind, (text, got)
    for k, v in fields.items():
        assert getattr(got, k) == v, (text, k, got)
    if kind == REF:
        assert got.reason and got.reason.startswith("not done") and "nothing changed" in got.reason, got
        if got.suggest is not None:  # what it offers is itself exactly a command, one that acts
            assert parse(got.suggest).kind in ACTING and f"'{got.suggest}'" in got.reason


@pytest.mark.parametrize("text,meant", [
    ("should I approve 7?", "approve 7"), ("approve 7 later", "approve 7"), ("批准 7 吗？", "approve 7"),
    ("approve 7 if TTFT stays low", "approve 7"), ("pause?", "pause"), ("stop tomorrow", "stop"),
    ("go back to the best?", "go back to the best"), ("approve 7 👍", "approve 7")])
def test_a_near_miss_offers_the_exact_command_it_may_have_meant(text, meant):
    assert parse(text).suggest == meant


@pytest.mark.parametrize("text", ["don’t approve 7", "I wouldn’t approve 7", "approve 7? no", "approve 7 — no wait",
                                  "stop approving 7", "hold off on 7", "approve 7 and 8", "不要批准 7", "don't stop"])
def test_a_negation_a_second_target_or_a_second_command_is_offered_no_action(text):
    """Nothing is offered that the person may have meant the opposite of, or only half of."""
    got = parse(text)
    assert got.kind == REF and got.suggest is None


def test_through_the_api_a_refused_message_changes_nothing_and_approve_then_approves(client):  # noqa: F811
    c = client
    gid = c.post("/goals", json=small_goal(experiments=3), headers=auth("admin")).json()["id"]
    first = wait_until(lambda: c.get(f"/goals/{gid}/candidates?awaiting=true", headers=auth("viewer")).json())[0]
    n = first["id"]
    for text in (t.format(n=n, m=n + 1) for t in ISSUE):
        out = say(c, gid, text)
        assert out["action"] is None and out["intent"]["kind"] == REF and "nothing changed" in out["reply"], text
    assert c.get(f"/candidates/{n}/approval", headers=auth("viewer")).json() is None  # no decision
    assert c.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json() == []  # neither paused nor stopped
    assert c.get(f"/goals/{gid}", headers=auth("viewer")).json()["status"] == "waiting"
    assert say(c, gid, f"approve {n}")["action"]["decision"] == "approve"
    space = small_goal()["search_space"]["concurrency"]
    for text in ("one more round at C1e309", "one more round at C9O", "one more round at C-5"):
        assert "nothing changed" in say(c, gid, text)["reply"]
    off = next(v for v in range(1, 1000) if v not in space)
    reply = say(c, gid, f"one more round at C{off}")["reply"]
    assert reply.startswith(f"not done: concurrency={off} is not one of the goal's values for concurrency: ")
    assert all(f"{v:g}" in reply for v in space)
    assert c.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json() == []  # nothing queued
    assert c.get(f"/candidates/{n}/approval", headers=auth("viewer")).json()["decision"] == "approve"
    on = say(c, gid, f"one more round at C{space[-1]}")
    ins = c.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json()[-1]
    assert on["action"]["instruction"] == ins["id"] and ins["text"] == f"chat: one more round at C{space[-1]}"


ROUND_TRIP = [Intent(kind="approve", candidate_id=7), Intent(kind="approve", candidate_id=7, card_hash="0123456789abcdef"),
              Intent(kind="reject", candidate_id=3, reason="TPOT too close"), Intent(kind="pause"),
              Intent(kind="resume"), Intent(kind="stop"), Intent(kind="restore_best"),
              Intent(kind="one_more_round", count=2, knobs={"concurrency": 90}),
              Intent(kind="one_more_round", count=1, knobs={"concurrency": 90, "request_rate": 7.25}),
              Intent(kind="one_more_round", count=1), Intent(kind="extend_budget", card_hours=10.0),
              Intent(kind="extend_budget", card_hours=2.5, experiments=3),
              Intent(kind="refuse_extension", reason="too costly"), Intent(kind="refuse_extension")]


@pytest.mark.parametrize("intent", ROUND_TRIP, ids=lambda i: i.kind)
def test_the_command_shown_back_for_a_reading_parses_to_that_reading(intent):
    """What an LLM read is shown back as a command; sent as it is, the parser reads exactly that intent."""
    assert parse(command_text(intent)) == intent, command_text(intent)


def test_what_is_no_command_has_no_command_text():
    assert all(command_text(Intent(kind=k)) is None for k in ("status", "unknown", "why_rejected", "refused"))
    assert command_text(Intent(kind="reject", candidate_id=3)) is None  # a rejection says why


@pytest.mark.parametrize("text", HELD_BACK)
def test_the_held_back_table_acts_on_nothing(text):
    """Written after the grammar was done (tests/chat_heldback.py): none of it may act."""
    got = parse(text.format(n=7, m=8))
    assert got.kind == REF and "nothing changed" in (got.reason or ""), got

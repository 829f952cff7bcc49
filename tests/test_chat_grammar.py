"""The chat grammar cannot act by accident (issue 36 item 1): a table of utterances, English and Chinese, with
typos, negations, several commands and numbers that are not numbers, each with the one action it must produce.
A negated command, a message with several commands and a knob value that is not a number are `refused`
(nothing is done, the reply says why); through the API a refused message changes nothing, an approved card
stays approved, and a round at a value the goal cannot take is refused naming the goal's values."""
from __future__ import annotations

import pytest
from test_api_support import auth, small_goal, wait_until
from test_chat import client, say  # noqa: F401  (client: the API with a sqlite store, as the chat tests use it)

from api.chat import Intent, command_text, parse

A, R, REF, UNK = "approve", "reject", "refused", "unknown"
TABLE: list[tuple[str, str, dict]] = [
    # plain commands
    ("approve 7", A, {"candidate_id": 7}), ("Approve candidate #12", A, {"candidate_id": 12}),
    ("APPROVE 3", A, {"candidate_id": 3}), ("lgtm 4", A, {"candidate_id": 4}),
    ("go ahead with 9", A, {"candidate_id": 9}), ("accept card 11", A, {"candidate_id": 11}),
    ("approve experiment 2", A, {"candidate_id": 2}), ("approve no. 5", A, {"candidate_id": 5}),
    ("  approve   8  ", A, {"candidate_id": 8}), ("approve 57号", A, {"candidate_id": 57}),
    ("批准 7", A, {"candidate_id": 7}), ("批准第 7 个", A, {"candidate_id": 7}), ("同意 12", A, {"candidate_id": 12}),
    ("通过 候选 3", A, {"candidate_id": 3}), ("可以跑 6", A, {"candidate_id": 6}), ("批准 7 号", A, {"candidate_id": 7}),
    ("reject 3 because TPOT is too close", R, {"candidate_id": 3, "reason": "TPOT is too close"}),
    ("decline 4 since the client is not the limit", R, {"candidate_id": 4}),
    ("deny 5 due to cost", R, {"candidate_id": 5}), ("拒绝 3 因为 TPOT 太高", R, {"candidate_id": 3}),
    ("否决 8 因为太贵", R, {"candidate_id": 8}), ("驳回 2 原因：没必要", R, {"candidate_id": 2}),
    ("reject 3 because it would stop the loop and approve nothing", R, {"candidate_id": 3}),
    # a reason starts at a whole word: "as" inside "was" is none, and a blank or punctuation-only reason is none
    ("reject 3 it was too slow", R, {"candidate_id": 3, "reason": None}),
    ("reject 3 as it is too slow", R, {"candidate_id": 3, "reason": "it is too slow"}),
    ("reject 3 because   ", R, {"candidate_id": 3, "reason": None}),
    ("reject 3 because ...", R, {"candidate_id": 3, "reason": None}),
    ("pause", "pause", {}), ("暂停", "pause", {}), ("Pause please", "pause", {}), ("hold", "pause", {}),
    ("resume", "resume", {}), ("继续", "resume", {}), ("carry on", "resume", {}), ("恢复", "resume", {}),
    ("stop", "stop", {}), ("停止", "stop", {}), ("abort", "stop", {}), ("终止", "stop", {}),
    ("go back to the best", "restore_best", {}), ("restore best", "restore_best", {}),
    ("回到最佳", "restore_best", {}), ("回滚到最优", "restore_best", {}),
    ("status", "status", {}), ("状态", "status", {}), ("how's it going", "status", {}), ("进度", "status", {}),
    ("why was 12 rejected?", "why_rejected", {"candidate_id": 12}),
    ("为什么拒绝了 12", "why_rejected", {"candidate_id": 12}),
    ("extend budget by 10 card-hours", "extend_budget", {"card_hours": 10.0}),
    ("预算增加 5 卡时", "extend_budget", {"card_hours": 5.0}),
    ("refuse the extension because enough", "refuse_extension", {"reason": "enough"}),
    ("拒绝追加预算", "refuse_extension", {}), ("不追加预算 因为 够了", "refuse_extension", {}),
    ("no extension", "refuse_extension", {}),
    # rounds and their numbers
    ("one more round at C90", "one_more_round", {"count": 1, "knobs": {"concurrency": 90}}),
    ("two more rounds at C=64", "one_more_round", {"count": 2, "knobs": {"concurrency": 64}}),
    ("one more round at C 64", "one_more_round", {"knobs": {"concurrency": 64}}),
    ("one more round at concurrency 32", "one_more_round", {"knobs": {"concurrency": 32}}),
    ("one more round at C90 r=7.5", "one_more_round", {"knobs": {"concurrency": 90, "request_rate": 7.5}}),
    ("one more round at r=6", "one_more_round", {"knobs": {"request_rate": 6.0}}),
    ("再跑一轮 C90", "one_more_round", {"knobs": {"concurrency": 90}}),
    ("再跑两轮 并发 32", "one_more_round", {"count": 2, "knobs": {"concurrency": 32}}),
    ("one more round", "one_more_round", {"knobs": {}}),
    ("one more round at the best card", "one_more_round", {"knobs": {}}),
    ("3 more rounds", "one_more_round", {"count": 3}),
    ("one more round at C1e309", REF, {}), ("one more round at C9O", REF, {}), ("one more round at C90.5", REF, {}),
    ("one more round at C-5", REF, {}), ("one more round at C+5", REF, {}), ("one more round at C0x10", REF, {}),
    ("one more round at C1234567", REF, {}), ("one more round at r=1e3", REF, {}), ("one more round at r=-2", REF, {}),
    ("one more round at r=6.", REF, {}), ("再跑一轮 C9O", REF, {}), ("再跑一轮 并发 1e3", REF, {}),
    ("one more round at concurrency 12abc", REF, {}),
    # negations never act
    ("do not approve 57", REF, {}), ("don't approve 7", REF, {}), ("dont approve 7", REF, {}),
    ("never approve 7", REF, {}), ("please do NOT approve 7", REF, {}), ("DO NOT APPROVE 7", REF, {}),
    ("do not, approve 7", A, {"candidate_id": 7}),  # the comma ends the negation: this says approve
    ("not approve 7", REF, {}), ("no approve 7", REF, {}), ("please don't approve 7", REF, {}),
    ("don't reject 4", REF, {}), ("do not reject 4 because cost", REF, {}), ("never stop", REF, {}),
    ("don't stop", REF, {}), ("do not pause", REF, {}), ("don't resume", REF, {}),
    ("don't go back to the best", REF, {}), ("do not restore the best", REF, {}),
    ("don't extend the budget by 5 card-hours", REF, {}), ("never 2 more rounds", REF, {}),
    ("don't do 2 more rounds", REF, {}),
    ("不要批准 57", REF, {}), ("别批准 7", REF, {}), ("不批准 7", REF, {}), ("不同意 7", REF, {}),
    ("不要通过 3", REF, {}), ("勿批准 3", REF, {}), ("禁止批准 3", REF, {}), ("不要拒绝 4", REF, {}),
    ("别停止", REF, {}), ("不要暂停", REF, {}), ("不要继续", REF, {}), ("不要回到最佳", REF, {}),
    ("别再跑一轮", REF, {}), ("不要 批准 57", REF, {}),
    # several commands in one message: nothing is done
    ("approve 12 and reject 13", REF, {}), ("approve 6; stop; approve 7", REF, {}),
    ("approve 1, approve 2", REF, {}), ("pause and then resume", REF, {}), ("stop, go back to the best", REF, {}),
    ("批准 3 然后 拒绝 4", REF, {}), ("批准 3；批准 4", REF, {}), ("暂停，然后继续", REF, {}),
    ("approve 3 and one more round at C90", REF, {}),
    # typos and numbers that are no candidate: no action
    ("aprove 7", UNK, {}), ("approve seven", UNK, {}), ("approve 5.7", UNK, {}), ("approve 57x", UNK, {}),
    ("approve", UNK, {}), ("批 准 7", UNK, {}), ("what a nice day", UNK, {}),
    ("hello there", UNK, {}), ("", UNK, {}), ("?", UNK, {}),
]


def test_the_table_is_large_and_covers_both_languages():
    assert len(TABLE) >= 100
    assert sum(1 for t, _, _ in TABLE if any("\u4e00" <= ch <= "\u9fff" for ch in t)) >= 30


@pytest.mark.parametrize("text,kind,fields", TABLE, ids=[t or "(empty)" for t, _, _ in TABLE])
def test_each_utterance_has_exactly_its_action(text, kind, fields):
    got = parse(text)
    assert got.kind == kind, (text, got)
    for k, v in fields.items():
        assert getattr(got, k) == v, (text, k, got)
    if kind == REF:
        assert got.reason and got.reason.startswith("not done") and "nothing changed" in got.reason, got


def test_through_the_api_a_refused_message_changes_nothing(client):  # noqa: F811
    c = client
    gid = c.post("/goals", json=small_goal(experiments=3), headers=auth("admin")).json()["id"]
    first = wait_until(lambda: c.get(f"/goals/{gid}/candidates?awaiting=true", headers=auth("viewer")).json())[0]
    for text in (f"do not approve {first['id']}", f"不要批准 {first['id']}", f"approve {first['id']} and stop"):
        out = say(c, gid, text)
        assert out["action"] is None and out["intent"]["kind"] == "refused" and "nothing changed" in out["reply"]
    assert c.get(f"/candidates/{first['id']}/approval", headers=auth("viewer")).json() is None  # no decision
    assert say(c, gid, f"approve {first['id']}")["action"]["decision"] == "approve"
    before = c.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json()
    space = small_goal()["search_space"]["concurrency"]
    for text in ("one more round at C1e309", "one more round at C9O", "one more round at C-5"):
        assert "nothing changed" in say(c, gid, text)["reply"]
    off = next(v for v in range(1, 1000) if v not in space)
    reply = say(c, gid, f"one more round at C{off}")["reply"]
    assert reply.startswith(f"not done: concurrency={off} is not one of the goal's values for concurrency: ")
    assert all(f"{v:g}" in reply for v in space)
    assert c.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json() == before  # nothing queued
    ap = c.get(f"/candidates/{first['id']}/approval", headers=auth("viewer")).json()
    assert ap["decision"] == "approve"  # the approval stands: no refused message cancelled it
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

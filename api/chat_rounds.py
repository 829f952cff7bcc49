"""The chat sentences that carry numbers of their own: rounds (a count and knob values) and the budget.

    K more round(s) [at C90 [r=7.5]]          再跑 K 轮 [C90] [速率 7.5]
    extend budget by H card-hours [and E experiments] · add H card-hours [to the budget]
    预算增加 H 卡时 [和 E 个实验] · 追加 H 卡时预算
    refuse the extension [because REASON] · no extension · 拒绝追加预算 · 不追加预算 [因为 REASON]

A knob value is exactly a number: C is whole, r a plain decimal; "C1e309", "C9O", "C-5" are refused naming the
value (a round at a value nobody meant is worse than none).
"""
from __future__ import annotations

import re
from typing import Any

from api.chat_intent import BECAUSE, CN_COUNT, COUNT_WORDS, NUMBERS, W, Intent, with_reason
from api.chat_words import Cursor

MORE_ROUNDS = W("more rounds", "more round")
CN_ROUND = W("再跑", "再来", "再做", "再")
AT = W("at", "with", "在")
CONC = W("c =", "c", "concurrency =", "concurrency", "并发 =", "并发")
RATE = W("r =", "r", "rate =", "rate", "request rate =", "request rate", "request _ rate =", "request _ rate",
         "速率 =", "速率")
AND = W("and", ",", "和", "及")
HOURS = W("card-hours", "card-hour", "card hours", "card hour", "card-h", "cardhours", "卡时", "卡小时", "个卡时")
EXPERIMENTS = W("experiments", "experiment", "runs", "run", "个实验", "次实验", "实验")
EXTEND = W("extend the budget by", "extend budget by", "increase the budget by", "increase budget by",
           "raise the budget by", "raise budget by", "extend the budget", "extend budget", "预算增加", "预算追加",
           "预算提高", "预算扩大", "预算加")
ADD = W("add", "grant", "追加", "增加")
REFUSE = W("refuse the extension", "refuse the budget extension", "refuse extension", "refuse to extend the budget",
           "decline the extension", "deny the extension", "reject the extension", "no extension", "no budget extension",
           "拒绝追加预算", "拒绝增加预算", "拒绝扩大预算", "拒绝预算", "不追加预算", "不增加预算", "预算不追加", "预算不增加")
_C_VALUE = re.compile(r"(?:\bC|\b(?i:concurrency)|并发)\s*=?\s*([-+.\d][^\s,;，；。、]*)")
_R_VALUE = re.compile(r"(?:\b[rR]|\b(?i:rate|request[_ ]rate)|速率)\s*=?\s*([-+.\d][^\s,;，；。、]*)")


def _count(c: Cursor) -> int | None:
    n = c.number(3)
    if n is not None:
        return n
    w = c.take(COUNT_WORDS) or c.take(CN_COUNT)
    return NUMBERS[w[0]] if w else None


def _knobs(c: Cursor) -> dict[str, Any] | None:
    """'C90 r=7.5', 'concurrency 32 and r=6', '并发 32': each knob once; None when the rest is anything else."""
    out: dict[str, Any] = {}
    while not c.done():
        if out:
            c.take(AND)
        if c.take(CONC) and "concurrency" not in out and (v := c.number(6)) is not None:
            out["concurrency"] = v
        elif c.take(RATE) and "request_rate" not in out and (r := c.decimal()) is not None:
            out["request_rate"] = r
        else:
            return None
    return out


def bad_value(text: str) -> str | None:
    """Why a knob value as typed is no value ('C9O': concurrency takes a whole number), else None."""
    m = _C_VALUE.search(text)
    if m and not re.fullmatch(r"\d{1,6}", m.group(1)):
        return f"{m.group(0).strip()!r}: concurrency takes a whole number such as C90"
    m = _R_VALUE.search(text)
    if m and not re.fullmatch(r"\d{1,6}(?:\.\d{1,6})?", m.group(1)):
        return f"{m.group(0).strip()!r}: request_rate takes a plain number such as r=6 or r=7.5"
    return None


def rounds(c: Cursor) -> Intent | None:
    if c.take(CN_ROUND):
        n = _count(c)
        if n is None or not c.take(W("轮")):
            return None
        c.take(AT)
    else:
        n = _count(c)
        if n is None or not c.take(MORE_ROUNDS):
            return None
        if not c.done() and not c.take(AT):
            return None
    rest_at = c.i
    knobs = _knobs(c)
    if knobs is None:
        tail = c.text[c.toks[rest_at].start:] if rest_at < len(c.toks) else ""
        if (why := bad_value(tail)) is not None:
            return Intent(kind="refused", reason=f"not done: {why}; nothing changed")
        return None
    if not 1 <= n <= 20:
        return Intent(kind="refused", reason=f"not done: {n} rounds: one instruction asks for 1 to 20; nothing changed")
    return Intent(kind="one_more_round", count=n, knobs=knobs)


def budget(c: Cursor) -> Intent | None:
    if c.take(REFUSE):
        if c.done():
            return Intent(kind="refuse_extension")
        return with_reason(Intent(kind="refuse_extension"), c.rest()) if c.take(BECAUSE) else None
    if c.take(EXTEND):
        c.take(W("by"))
        hours = c.decimal()
        if hours is None or not c.take(HOURS):
            return None
    elif c.take(ADD):
        hours = c.decimal()
        if hours is None or not c.take(HOURS):
            return None
        c.take(W("to the budget", "预算"))
    else:
        return None
    experiments = None
    if c.take(AND):
        experiments = c.number(5)
        if experiments is None or not c.take(EXPERIMENTS):
            return None
    if not c.done():
        return None
    if not 0 < hours <= 1e6 or (experiments or 0) > 10_000:
        return Intent(kind="refused", reason="not done: an extension adds more than 0 and at most 1000000 card-hours "
                                             "and at most 10000 experiments; nothing changed")
    return Intent(kind="extend_budget", card_hours=hours, experiments=experiments)

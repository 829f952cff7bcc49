"""Chat commands, English and Chinese, parsed deterministically into a small set of intents.

`parse(text)` is pure: approve N, reject N because …, pause, resume, stop, one more round at C90,
go back to the best, status, why was N rejected?, extend budget by 10 card-hours, refuse the extension.  An optional LLM only maps free text onto the
same `Intent` (api/chat_llm.py); every action is then taken by the same code (api/actions.py).

It cannot act by accident: a negated command ("do not approve 57", "never approve 7", "不要批准 57", "别批准 7")
is `refused` and says so; so is a message with more than one command ("approve 12 and reject 13": one command per
message, nothing is done) and a number that is not exactly a number ("C1e309", "C9O", "C90.5", "C-5", "approve
5.7"). A refused message is never handed to the language model.
"""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

IntentKind = Literal["approve", "reject", "pause", "resume", "stop", "one_more_round", "restore_best", "status",
                     "why_rejected", "extend_budget", "refuse_extension", "refused", "unknown"]
_NUM = {"one": 1, "a": 1, "another": 1, "two": 2, "three": 3, "four": 4, "five": 5,
        "一": 1, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5}
# a candidate number is whole: "5.7", "57x" and "5,7" name no candidate (the rule does not match)
_ID = r"(?:candidate|card|experiment|#|no\.?|候选|卡片?|实验|编号|第)?\s*#?\s*(\d+)(?![.,]\d|[A-Za-z_\d])\s*(?:号|个)?"


class Intent(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: IntentKind
    candidate_id: int | None = Field(None, ge=1)
    card_hash: str | None = Field(None, pattern=r"^[0-9a-f]{16}$")
    reason: str | None = Field(None, max_length=500)
    count: int | None = Field(None, ge=1, le=20)
    knobs: dict[str, Any] = Field(default_factory=dict)
    card_hours: float | None = Field(None, ge=0, le=1e6)  # extend_budget
    experiments: int | None = Field(None, ge=0, le=10_000)


# a knob value as typed, from its first number-like character to the next space or separator, so "C1e309" and
# "C9O" are seen whole (and a word that merely starts with c or r is no knob)
_C_VALUE = re.compile(r"(?:\bC|\b(?i:concurrency)|并发)\s*=?\s*([-+.\d][^\s,;，；。、]*)")
_R_VALUE = re.compile(r"(?:\b[rR]|\b(?i:rate|request[_ ]rate)|速率)\s*=?\s*([-+.\d][^\s,;，；。、]*)")


def _knobs(text: str) -> tuple[dict[str, Any], str | None]:
    """The knobs a round names, or the reason a value is no value: C is a whole number, r a plain decimal."""
    out: dict[str, Any] = {}
    m = _C_VALUE.search(text)
    if m:
        if not re.fullmatch(r"\d{1,6}", m.group(1)):
            return {}, f"{m.group(0).strip()!r}: concurrency takes a whole number such as C90"
        out["concurrency"] = int(m.group(1))
    m = _R_VALUE.search(text)
    if m:
        if not re.fullmatch(r"\d{1,6}(?:\.\d{1,6})?", m.group(1)):
            return {}, f"{m.group(0).strip()!r}: request_rate takes a plain number such as r=6 or r=7.5"
        out["request_rate"] = float(m.group(1))
    return out, None


def _count(text: str) -> int:
    m = re.search(r"(\d+|one|a|another|two|three|four|five|[一两二三四五])\s*(?:more\s+)?(?:rounds?|轮)", text, re.I)
    if not m:
        return 1
    w = m.group(1).lower()
    return int(w) if w.isdigit() else _NUM.get(w, 1)


_HOURS = r"(\d+(?:\.\d+)?)\s*(?:more\s+)?(?:card[- ]?hours?|card[- ]?h\b|卡时|卡小时|个卡时)"
_RULES: list[tuple[str, str]] = [
    ("refuse_extension", r"(?:(?:refuse|decline|deny|reject|no)\s+(?:to\s+extend\s+the\s+budget|(?:the\s+)?(?:budget\s+)?extension)"
                         r"|拒绝(?:追加|增加|扩大)?预算|不(?:追加|增加|扩大)预算|预算不(?:追加|增加))"),
    ("extend_budget", r"(?:(?:extend|increase|raise|grow)\s+(?:the\s+)?budget\s+(?:by\s+)?" + _HOURS
                      + r"|(?:add|grant)\s+" + _HOURS + r"(?:\s+to\s+the\s+budget)?"
                      r"|预算\s*(?:增加|追加|提高|扩大|加)\s*" + _HOURS + r"|(?:追加|增加)\s*" + _HOURS + r"\s*预算)"),
    ("why_rejected", r"(?:why\s+(?:was|is|did)\s+" + _ID + r".*?(?:reject|refus|negative|fail))"
                     r"|(?:" + _ID + r"\s*(?:为什么|为何).*?(?:拒绝|否决|失败|负))"
                     r"|(?:(?:为什么|为何).*?(?:拒绝|否决)(?:了)?\s*" + _ID + r")"),
    ("reject", r"(?:^|\b)(?:reject|decline|deny|拒绝|否决|驳回)\s*" + _ID),
    ("approve", r"(?:^|\b)(?:approve|approved|accept|lgtm|go ahead with|批准|同意|通过|可以跑)\s*" + _ID),
    ("one_more_round", r"(?:(?:\d+|one|a|another|two|three|four|five)\s+more\s+rounds?|再(?:跑|来|做)?\s*[一两二三四五\d]+\s*轮)"),
    ("restore_best", r"(?:go\s+back\s+to\s+(?:the\s+)?best|restore\s+(?:the\s+)?best|roll\s*back\s+to\s+(?:the\s+)?best"
                     r"|回(?:到|退到|滚到)?\s*(?:最佳|最好|最优))"),
    ("pause", r"^\s*(?:pause|hold|暂停|先停一下)\b"),
    ("resume", r"^\s*(?:resume|continue|carry on|unpause|继续|恢复)\b"),
    ("stop", r"^\s*(?:stop|halt|abort|停止|结束|终止)\b"),
    ("status", r"^\s*(?:status|progress|how(?:'s| is) it going|where are we|状态|进度|现在怎么样|情况)"),
]


# the command rules (what changes something), as words that can be counted anywhere in a message
_ACTS = {"approve": r"(?:approve|accept|lgtm|go ahead with|批准|同意|通过|可以跑)",
         "reject": r"(?:reject|decline|deny|拒绝|否决|驳回)",
         "pause": r"(?:pause|暂停)", "resume": r"(?:resume|unpause|继续|恢复)", "stop": r"(?:stop|halt|abort|停止|终止)",
         "one_more_round": r"(?:more\s+rounds?|再(?:跑|来|做)?\s*[一两二三四五\d]+\s*轮)",
         "restore_best": r"(?:go\s+back\s+to|restore|roll\s*back|回(?:到|退到|滚到)?\s*(?:最佳|最好|最优))",
         "extend_budget": r"(?:extend|预算\s*(?:增加|追加|提高|扩大|加)|追加)"}
# a negation right before a command word (at most two words between: "do NOT approve", "please don't approve")
_NEG = re.compile(r"(?:\b(?:not|don'?t|dont|never|no)\b(?:\s+\w+){0,2}?\s*|(?:不要|别|不|勿|禁止)\s*)$", re.I)
# where a reason starts: a whole English word ("as" inside "was" is not one) or a Chinese marker
_REASON = re.compile(r"(?:\b(?:because|since|as|due\s+to)\b|\breason\b:?|因为|原因[:：]?|由于)\s*(.+)$", re.I)


def _reason(t: str) -> str | None:
    """The reason a message gives, or None when it gives none or only white space and punctuation."""
    r = _REASON.search(t)
    said = r.group(1).strip() if r else ""
    return said if re.search(r"\w", said) else None


def _refusal(t: str) -> str | None:
    """Why a message must not act: a negated command, or several commands in one message (before a reason)."""
    if re.search(dict(_RULES)["refuse_extension"], t, re.I):  # "不追加预算" says no on purpose: it is the command
        return None
    head = t[:m.start()] if (m := _REASON.search(t)) else t
    found: list[tuple[int, str, str]] = []
    for kind, word in _ACTS.items():
        for w in re.finditer(r"(?<![A-Za-z])" + word + r"(?![A-Za-z])", head, re.I):
            found.append((w.start(), kind, w.group(0)))
    found.sort()
    for start, kind, word in found:
        if _NEG.search(head[:start]):
            return (f"not done: you said not to {word} ({kind.replace('_', ' ')}); nothing changed. Say it without "
                    "the negation to act, or reject N because … to reject")
    if len(found) > 1:
        said = ", ".join(w for _, _, w in found)
        return (f"not done: one command per message, and this one has {len(found)} ({said}); nothing changed. "
                "Send each as its own message")
    return None


def parse(text: str) -> Intent:
    """The intent of one chat message; `unknown` when no rule matches (never a guess); `refused` (with the reason)
    when it must not act: a negated command, several commands, or a number that is not one."""
    t = " ".join(text.strip().split())
    if (why := _refusal(t)) is not None:
        return Intent(kind="refused", reason=why[:500])
    for kind, pattern in _RULES:
        m = re.search(pattern, t, re.I)
        if not m:
            continue
        num = next((int(g) for g in m.groups() if g and g.isdigit()), None)
        if kind in ("approve", "reject", "why_rejected"):
            h = re.search(r"\b([0-9a-f]{16})\b", t)
            reason = None
            if kind == "reject":
                reason = _reason(t)
            return Intent(kind=kind, candidate_id=num, card_hash=h.group(1) if h else None, reason=reason)
        if kind == "one_more_round":
            knobs, bad = _knobs(t)
            if bad is not None:
                return Intent(kind="refused", reason=f"not done: {bad}; nothing changed"[:500])
            return Intent(kind=kind, count=_count(t), knobs=knobs)
        if kind == "extend_budget":
            hours = next(float(g) for g in m.groups() if g)
            n = re.search(r"(\d+)\s*(?:more\s+)?(?:experiments?|runs?|个?实验|次实验)", t[m.end():], re.I)
            return Intent(kind=kind, card_hours=hours, experiments=int(n.group(1)) if n else None)
        if kind == "refuse_extension":
            return Intent(kind=kind, reason=_reason(t))
        return Intent(kind=kind)
    return Intent(kind="unknown")


def command_text(intent: Intent) -> str | None:
    """The command a person types for this intent, in the parser's own words (parse(command_text(i)) gives i
    back: tests/test_chat_grammar.py checks every kind); None for what is not a command (status, unknown, …).
    What an LLM read from free text is shown back in these words and acts only when the person sends them."""
    k, n = intent.kind, intent.candidate_id
    if k == "approve" and n:
        return f"approve {n}" + (f" {intent.card_hash}" if intent.card_hash else "")
    if k == "reject" and n and intent.reason:
        return f"reject {n}" + (f" {intent.card_hash}" if intent.card_hash else "") + f" because {intent.reason}"
    if k in ("pause", "resume", "stop"):
        return k
    if k == "restore_best":
        return "go back to the best"
    if k == "one_more_round":
        at = " ".join(f"C{v}" if key == "concurrency" else f"r={f'{v:.6f}'.rstrip('0').rstrip('.')}"
                      for key, v in sorted(intent.knobs.items()) if key in ("concurrency", "request_rate"))
        return f"{intent.count or 1} more round{'s' if (intent.count or 1) > 1 else ''}" + (f" at {at}" if at else "")
    if k == "extend_budget" and intent.card_hours is not None:
        return (f"extend budget by {intent.card_hours:g} card-hours"
                + (f" and {intent.experiments} experiments" if intent.experiments is not None else ""))
    if k == "refuse_extension":
        return "refuse the extension" + (f" because {intent.reason}" if intent.reason else "")
    return None


HELP = ("I understand: approve N · reject N because … · pause · resume · stop · one more round at C90 · "
        "go back to the best · status · why was N rejected? · extend budget by 10 card-hours [and 1 experiment] · "
        "refuse the extension because …  (中文: 批准 N · 拒绝 N 因为… · 暂停 · 继续 · 停止 · "
        "再跑一轮 C90 · 回到最佳 · 状态 · 为什么拒绝了 N · 预算增加 10 卡时 · 拒绝追加预算 因为…)")

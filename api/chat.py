"""Chat commands, English and Chinese, parsed deterministically into a small set of intents.

`parse(text)` is pure: approve N, reject N because …, pause, resume, stop, one more round at C90,
go back to the best, status, why was N rejected?, extend budget by 10 card-hours, refuse the extension.  An optional LLM only maps free text onto the
same `Intent` (api/chat_llm.py); every action is then taken by the same code (api/actions.py).
"""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

IntentKind = Literal["approve", "reject", "pause", "resume", "stop", "one_more_round", "restore_best", "status",
                     "why_rejected", "extend_budget", "refuse_extension", "unknown"]
_NUM = {"one": 1, "a": 1, "another": 1, "two": 2, "three": 3, "four": 4, "five": 5,
        "一": 1, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5}
_ID = r"(?:candidate|card|experiment|#|no\.?|候选|卡片?|实验|编号|第)?\s*#?\s*(\d+)\s*(?:号|个)?"


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


def _knobs(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    m = re.search(r"\b(?:C|concurrency|并发)\s*=?\s*(\d+)", text, re.I) or re.search(r"(?:C|并发)\s*(\d+)", text)
    if m:
        out["concurrency"] = int(m.group(1))
    m = re.search(r"\b(?:r|rate|request[_ ]rate|速率)\s*=?\s*(\d+(?:\.\d+)?)\b", text, re.I)
    if m:
        out["request_rate"] = float(m.group(1))
    return out


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


def parse(text: str) -> Intent:
    """The intent of one chat message; `unknown` when no rule matches (never a guess)."""
    t = " ".join(text.strip().split())
    for kind, pattern in _RULES:
        m = re.search(pattern, t, re.I)
        if not m:
            continue
        num = next((int(g) for g in m.groups() if g and g.isdigit()), None)
        if kind in ("approve", "reject", "why_rejected"):
            h = re.search(r"\b([0-9a-f]{16})\b", t)
            reason = None
            if kind == "reject":
                r = re.search(r"(?:because|since|as|reason:?|due to|因为|原因[:：]?|由于)\s*(.+)$", t, re.I)
                reason = r.group(1).strip() if r else None
            return Intent(kind=kind, candidate_id=num, card_hash=h.group(1) if h else None, reason=reason)
        if kind == "one_more_round":
            return Intent(kind=kind, count=_count(t), knobs=_knobs(t))
        if kind == "extend_budget":
            hours = next(float(g) for g in m.groups() if g)
            n = re.search(r"(\d+)\s*(?:more\s+)?(?:experiments?|runs?|个?实验|次实验)", t[m.end():], re.I)
            return Intent(kind=kind, card_hours=hours, experiments=int(n.group(1)) if n else None)
        if kind == "refuse_extension":
            r = re.search(r"(?:because|since|as|reason:?|due to|因为|原因[:：]?|由于)\s*(.+)$", t, re.I)
            return Intent(kind=kind, reason=r.group(1).strip() if r else None)
        return Intent(kind=kind)
    return Intent(kind="unknown")


HELP = ("I understand: approve N · reject N because … · pause · resume · stop · one more round at C90 · "
        "go back to the best · status · why was N rejected? · extend budget by 10 card-hours [and 1 experiment] · "
        "refuse the extension because …  (中文: 批准 N · 拒绝 N 因为… · 暂停 · 继续 · 停止 · "
        "再跑一轮 C90 · 回到最佳 · 状态 · 为什么拒绝了 N · 预算增加 10 卡时 · 拒绝追加预算 因为…)")

"""Chat commands, English and Chinese: a message acts only when it is exactly one sentence of this grammar.

`parse(text)` is pure. After normalisation (api/chat_words.py: NFKC, quotes folded, case, white space, final
punctuation other than "?") the whole message must be one of these sentences, nothing before or after ("please"
may open or close it):

    approve N [card hash]                 批准 N          (accept / lgtm / go ahead with; 同意 / 通过 / 可以跑)
    reject N [card hash] because REASON   拒绝 N 因为 REASON   (":" is a separator too; decline / deny; 否决 / 驳回)
    pause · resume · stop                 暂停 · 继续 · 停止
    K more round(s) [at C90 r=7.5]        再跑 K 轮 [C90]
    go back to the best                   回到最佳
    extend budget by H card-hours [and E experiments]    预算增加 H 卡时
    refuse the extension [because REASON] 拒绝追加预算 [因为 REASON]
    status · why was N rejected?          状态 · 为什么拒绝了 N      (questions: they change nothing)

A candidate N is a whole number ("5.7", "57x" name none); an approval carries nothing after its target. Anything
else that mentions a command word or a candidate (a question, a hedge, a condition, "later", a second target, a
negation in any language) is `refused`: it acts on nothing, and the reply offers the exact command it may have
meant (`suggest`), which the person sends (or clicks) to act. A refused message is never handed to the language
model; what the model reads from other text is shown back as a command of this grammar (api/routes/chat.py).
"""
from __future__ import annotations

from api.chat_intent import ACTING, BECAUSE, W, Intent, IntentKind, with_reason
from api.chat_near import not_a_command
from api.chat_rounds import budget, rounds
from api.chat_words import Cursor, normalise, tokens

__all__ = ["ACTING", "HELP", "Intent", "IntentKind", "command_text", "parse"]  # the grammar's public names

APPROVE = W("approve", "accept", "lgtm", "go ahead with", "批准", "同意", "通过", "可以跑")
REJECT = W("reject", "decline", "deny", "拒绝", "否决", "驳回")
PAUSE, RESUME = W("pause", "hold", "暂停", "先停一下"), W("resume", "continue", "carry on", "unpause", "继续", "恢复")
STOP = W("stop", "halt", "abort", "停止", "结束", "终止")
BEST = W("go back to the best", "go back to best", "restore the best", "restore best", "roll back to the best",
         "roll back to best", "rollback to the best", "回到最佳", "回到最好", "回到最优", "回退到最佳", "回滚到最佳",
         "回滚到最优", "回最佳")
STATUS = W("status", "progress", "how's it going", "how is it going", "where are we", "状态", "进度", "现在怎么样", "情况")
PREFIX = W("candidate", "card", "experiment", "#", "no.", "no", "number", "候选", "卡片", "卡", "实验", "编号", "第")
SUFFIX = W("号", "个")
PLEASE = W("please", "pls", "请")
HEAD = 48  # tokens: the longest sentence before a reason ("extend the budget by 10 card-hours and 3 experiments")


def _without_please(said: str) -> str:
    """The message without a closing 'please' / ', please' / '请' (string ends, not a regex: linear)."""
    low = said[-8:].casefold()
    for word in (" please", " pls", ",please", ",pls", "请"):
        if low.endswith(word) and len(said) > len(word):
            return said[:-len(word)].rstrip(" ,")
    return said


def target(c: Cursor) -> int | None:
    """A candidate as people name it: '7', 'candidate #7', 'no. 7', '第 7 个', '57号'; None when there is none."""
    c.take(PREFIX)
    c.take(W("#"))
    n = c.number(64)  # any length: a number no candidate has is answered "no such candidate" (404)
    if n is not None:
        c.take(SUFFIX)
    return n


def card_hash(c: Cursor) -> str | None:
    t = c.peek()
    if t is not None and len(t) == 16 and all(ch in "0123456789abcdef" for ch in t):
        c.i += 1
        return t
    return None


def _decision(c: Cursor) -> Intent | None:
    kind = "approve" if c.take(APPROVE) else "reject" if c.take(REJECT) else None
    if kind is None or (n := target(c)) is None or n < 1:
        return None
    h = card_hash(c)
    if c.done():
        return Intent(kind=kind, candidate_id=n, card_hash=h)
    if kind == "reject" and c.take(BECAUSE):
        return with_reason(Intent(kind=kind, candidate_id=n, card_hash=h), c.rest())
    return None  # an approval carries nothing after its target


def _mode(c: Cursor) -> Intent | None:
    for kind, words in (("pause", PAUSE), ("resume", RESUME), ("stop", STOP), ("restore_best", BEST),
                        ("status", STATUS)):
        if c.take(words) and (kind != "status" or c.take(W("?")) or True) and c.done():
            return Intent(kind=kind)  # type: ignore[arg-type]  (a question only for status: "status?")
        c.i = 0
    return None


def _why(c: Cursor) -> Intent | None:
    """'why was 12 rejected?', '为什么拒绝了 12', '12 为什么被拒绝': a question, it changes nothing."""
    if c.take(W("why was", "why is", "why did", "why were")):
        n = target(c)
        ok = c.take(W("rejected", "refused", "negative", "fail", "failed", "declined", "denied", "judged negative"))
    elif c.take(W("为什么拒绝了", "为什么拒绝", "为何拒绝了", "为何拒绝", "为什么否决了", "为什么否决")):
        n, ok = target(c), True
    else:
        n = target(c)
        ok = c.take(W("为什么被拒绝", "为什么被拒绝了", "为何被拒绝", "为什么被否决", "为什么失败"))
    c.take(W("?"))
    return Intent(kind="why_rejected", candidate_id=n) if n and ok and c.done() else None


def parse(text: str) -> Intent:
    """The intent of one chat message: one exact sentence of the grammar, else `refused` with the command it may
    have meant (when it mentions a command word or a candidate), else `unknown` (never a guess)."""
    said = normalise(text)
    body = _without_please(said)
    toks = tokens(body, HEAD + 1)  # a sentence takes at most HEAD tokens before its reason
    c = Cursor(body, toks, more=len(toks) > HEAD)
    if c.take(PLEASE):
        c.take(W(","))
    c = Cursor(body, toks[c.i:HEAD], more=len(toks) > HEAD)
    for sentence in (_decision, _mode, _why, rounds, budget):
        c.i, c.more = 0, len(toks) > HEAD
        got = sentence(c)
        if got is not None and not (got.kind in ACTING and said.endswith("?")):  # a question never acts
            return got
    return not_a_command(said)


def command_text(intent: Intent) -> str | None:
    """The command a person types for this intent, in the parser's own words (parse(command_text(i)) gives i
    back: tests check every kind); None for what is not a command (status, unknown, …). What an LLM read from
    free text is shown back in these words and acts only when the person sends them."""
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
        return (f"extend budget by {f'{intent.card_hours:.6f}'.rstrip('0').rstrip('.')} card-hours"
                + (f" and {intent.experiments} experiments" if intent.experiments is not None else ""))
    if k == "refuse_extension":
        return "refuse the extension" + (f" because {intent.reason}" if intent.reason else "")
    return None


HELP = ("I understand exactly these, one per message: approve N · reject N because … · pause · resume · stop · "
        "one more round at C90 · go back to the best · status · why was N rejected? · extend budget by 10 card-hours "
        "[and 1 experiment] · refuse the extension because …  (中文: 批准 N · 拒绝 N 因为… · 暂停 · 继续 · 停止 · "
        "再跑一轮 C90 · 回到最佳 · 状态 · 为什么拒绝了 N · 预算增加 10 卡时 · 拒绝追加预算 因为…)")

"""The chat grammar's table (no tests here): utterances as people type them, each with the one outcome it must get.

`{n}` is the candidate the loop waits for and `{m}` another, so the same rows run against the parser alone and
against a real `tuneloop serve` (REST, signed Slack, signed and encrypted Feishu). NOT_COMMANDS are the rows that
must act on nothing: every one mentions a command word or a candidate, and none is exactly one sentence of the
grammar. The table grows from misreads: a message that acted when it should not have goes here first.
"""
from __future__ import annotations

A, R, REF, UNK = "approve", "reject", "refused", "unknown"

# issue 44's table, as it was typed (U+2019 apostrophes, em dashes), each of them approved a waiting candidate
ISSUE = ["don’t approve {n}", "should I approve {n}?", "can you approve {n}?", "approve {n}?", "ok to approve {n}?",
         "I wouldn’t approve {n}", "I can’t approve {n} yet", "we won't approve {n}", "approve {n}? no",
         "approve {n} - actually no, wait", "approve {n} — no wait", "approve {n}...or not", "who approved {n}?",
         "did you approve {n}?", "approve {n} if TTFT stays low", "approve {n} later", "not now, approve {n} tomorrow",
         "approve {n} and {m}", "stop approving {n}", "hold off on {n}", "批准 {n} 吗？"]

NOT_COMMANDS = ISSUE + [
    # questions, in both languages and with full-width punctuation
    "approve {n} ?", "approve {n}？", "Approve {n}??", "approve {n}?!", "approve candidate {n}?", "lgtm {n}?",
    "should we approve {n}", "could you approve {n} please?", "would you approve {n}?", "is {n} approved?",
    "has {n} been approved?", "was {n} approved", "why approve {n}?", "why not approve {n}?", "approve {n}, right?",
    "approve {n} or reject it?", "approve or reject {n}?", "shall I approve {n}?", "may I approve {n}?",
    "what happens if I approve {n}?", "批准 {n}？", "要批准 {n} 吗", "批准 {n} 吗", "可以批准 {n} 吗？", "是否批准 {n}",
    "批准 {n} 呢？", "同意 {n} 吗？", "通过 {n} 嘛", "谁批准了 {n}？", "你批准了 {n} 吗？",
    # negations, every apostrophe a keyboard makes, and other languages
    "don't approve {n}", "don‘t approve {n}", "don`t approve {n}", "don´t approve {n}", "donʼt approve {n}",
    "do not approve {n}", "DO NOT APPROVE {n}", "never approve {n}", "not approve {n}", "no approve {n}",
    "please don’t approve {n}", "I don’t think we should approve {n}", "we shouldn’t approve {n}",
    "you mustn’t approve {n}", "I’d rather not approve {n}", "I can't approve {n}", "I cannot approve {n}",
    "I wouldn't approve {n}", "won’t approve {n}", "didn’t approve {n}", "approve {n} not", "approve {n} no",
    "approve {n}, no", "approve {n} NO", "approve {n} nope", "approve {n} nah", "approve {n} — no",
    "approve {n}. no", "approve {n}! no", "approve {n}... no", "approve {n} or not", "approve {n}? nope",
    "disapprove {n}", "nicht approve {n}", "approve {n} nicht", "ne pas approve {n}", "не approve {n}",
    "不要批准 {n}", "别批准 {n}", "不批准 {n}", "不同意 {n}", "不要通过 {n}", "勿批准 {n}", "禁止批准 {n}", "没批准 {n}",
    "未批准 {n}", "不要 批准 {n}", "批准 {n} 不", "批准 {n}，不要", "先别批准 {n}", "不要拒绝 {n}",
    "don't reject {n}", "do not reject {n} because cost", "never reject {n}", "don’t stop", "do not pause",
    "don't resume", "never stop", "don’t go back to the best", "不要暂停", "别停止", "不要继续", "不要回到最佳",
    "don't do 2 more rounds", "别再跑一轮", "no more rounds", "不要再跑两轮",
    # hedges, conditions, times
    "approve {n} if TTFT is fine", "approve {n} unless TPOT rises", "approve {n} when the run ends",
    "approve {n} after lunch", "approve {n} tomorrow", "approve {n} tonight", "approve {n} in an hour",
    "approve {n} maybe", "maybe approve {n}", "probably approve {n}", "I think approve {n}",
    "I guess approve {n}", "approve {n} I guess", "approve {n} for now", "approve {n} later today",
    "approve {n} eventually", "approve {n} once TTFT is known", "tomorrow approve {n}", "later, approve {n}",
    "approve {n} soon", "approve {n} asap?", "approve {n} 👍", "👍 approve {n}", "approve {n} 🚀", "approve {n} :)",
    "approve {n} thanks", "approve {n} thx", "approve {n} ok", "ok approve {n}?", "sure, approve {n} later",
    "approve {n} because it is good", "approve {n}: looks fine", "approve {n} since TTFT is fine",
    "如果 TTFT 没问题就批准 {n}", "明天批准 {n}", "批准 {n} 明天", "稍后批准 {n}", "批准 {n} 吧", "也许批准 {n}",
    "批准 {n} 以后", "等一下再批准 {n}", "批准 {n} 👍", "批准 {n} 因为 不错",
    # two targets, two commands
    "approve {n} and {m}", "approve {n}, {m}", "approve {n} {m}", "approve {n} & {m}", "approve {n} then {m}",
    "approve {n} and reject {m}", "approve {n}; reject {m} because cost", "approve {n} and stop",
    "approve {n} then pause", "approve {n}, stop", "approve {n} and one more round at C90", "pause and approve {n}",
    "stop, approve {n}", "approve {n}; approve {m}", "批准 {n} 和 {m}", "批准 {n}、{m}", "批准 {n} 然后 拒绝 {m}",
    "批准 {n}；批准 {m}", "批准 {n} 然后暂停", "approve {n}.{m}", "approve #{n} #{m}",
    # mode words inside other sentences: "stop approving N" never stops a goal, "hold off on N" never pauses
    "stop approving {n}", "stop approving things", "stop asking about {n}", "stop the approval of {n}",
    "hold off on {n}", "hold on {n}", "hold {n}", "pause {n}", "pause on {n}", "pause approving {n}",
    "resume {n}", "continue with {n}", "stop {n}", "halt {n}", "abort {n}", "stop it?", "pause?", "stop?",
    "should we stop?", "can you pause", "pause later", "stop tomorrow", "pause if TTFT rises", "stop now please?",
    "pause the goal and approve {n}", "please stop approving", "don’t stop approving", "stop, no",
    "pause no", "resume? no", "停止批准 {n}", "暂停 {n}", "暂停批准 {n}", "先停止吧？", "继续 {n}", "停止吗",
    "暂停一下吗", "停止 明天", "hold off", "hold it", "stop stop", "pause pause", "resume and stop",
    # numbers that are no candidate
    "approve {n}.5", "approve {n}x", "approve {n},5", "approve -{n}", "approve +{n}", "approve {n}e3",
    "approve 0x{n}", "approve {n}{n}x", "approve ¹{n}", "approve ①", "approve ⑦", "approve 𝟕", "approve ₇", "approve {n}²", "approve #-{n}", "approve 0", "approve 00",
    "aprove {n}", "approve seven", "approve", "approve {n} {n}", "{n}", "#{n}", "what about {n}?",
    # rounds and budget words in free text
    "one more round?", "one more round at C90?", "2 more rounds later", "one more round if it is cheap",
    "one more round at the best card", "do one more round", "maybe one more round", "再跑一轮吗",
    "one more round at C90 and approve {n}", "extend budget by 10 card-hours?", "extend the budget later",
    "refuse the extension?", "go back to the best?", "go back to the best later", "回到最佳吗", "restore {n}",
    "one more round at C9O", "one more round at C1e309", "one more round at C-5", "one more round at C90.5",
    "one more round at r=1e3", "one more round at r=-2", "再跑一轮 C9O", "25 more rounds",
    # reasons that say nothing
    "reject {n} because", "reject {n} because   ", "reject {n} because ...", "reject {n} because 👎",
    "reject {n} because 🙅‍♀️🙅", "reject {n}: ?!", "reject {n} : —", "拒绝 {n} 因为", "拒绝 {n} 因为 。。。",
    "reject {n} because ___", "refuse the extension because 🤷",
]

# exactly one sentence of the grammar: each acts, with these fields (n = 7, m = 8 in the unit table)
COMMANDS: list[tuple[str, str, dict]] = [
    ("approve {n}", A, {"candidate_id": 7}), ("Approve candidate #{n}", A, {"candidate_id": 7}),
    ("APPROVE {n}", A, {"candidate_id": 7}), ("lgtm {n}", A, {"candidate_id": 7}),
    ("go ahead with {n}", A, {"candidate_id": 7}), ("accept card {n}", A, {"candidate_id": 7}),
    ("approve experiment {n}", A, {"candidate_id": 7}), ("approve no. {n}", A, {"candidate_id": 7}),
    ("  approve   {n}  ", A, {"candidate_id": 7}), ("approve {n}号", A, {"candidate_id": 7}),
    ("approve {n}.", A, {"candidate_id": 7}), ("approve {n}!", A, {"candidate_id": 7}),
    ("approve {n}。", A, {"candidate_id": 7}), ("approve ７", A, {"candidate_id": 7}),
    ("ａｐｐｒｏｖｅ ７", A, {"candidate_id": 7}), ("please approve {n}", A, {"candidate_id": 7}),
    ("approve {n} please", A, {"candidate_id": 7}), ("approve {n}, please", A, {"candidate_id": 7}),
    ("批准 {n}", A, {"candidate_id": 7}), ("批准第 {n} 个", A, {"candidate_id": 7}), ("同意 {n}", A, {"candidate_id": 7}),
    ("通过 候选 {n}", A, {"candidate_id": 7}), ("可以跑 {n}", A, {"candidate_id": 7}),
    ("批准 {n} 号", A, {"candidate_id": 7}), ("批准 ７", A, {"candidate_id": 7}), ("批准 {n}。", A, {"candidate_id": 7}),
    ("请批准 {n}", A, {"candidate_id": 7}), ("批 准 {n}", A, {"candidate_id": 7}), ("批准{n}", A, {"candidate_id": 7}),
    ("approve {n} 0123456789abcdef", A, {"candidate_id": 7, "card_hash": "0123456789abcdef"}),
    ("reject {n} because TPOT is too close", R, {"candidate_id": 7, "reason": "TPOT is too close"}),
    ("reject {n}: TPOT is too close", R, {"candidate_id": 7, "reason": "TPOT is too close"}),
    ("Reject {n} because TPOT is too close.", R, {"candidate_id": 7, "reason": "TPOT is too close"}),
    ("reject {n} because it’s too slow", R, {"candidate_id": 7, "reason": "it's too slow"}),
    ("decline {n} because the client is the limit", R, {"candidate_id": 7}),
    ("deny {n}: cost", R, {"candidate_id": 7, "reason": "cost"}),
    ("reject {n} because 👎 too slow", R, {"candidate_id": 7, "reason": "👎 too slow"}),
    ("reject {n} because don't approve it, stop", R, {"candidate_id": 7, "reason": "don't approve it, stop"}),
    ("拒绝 {n} 因为 TPOT 太高", R, {"candidate_id": 7, "reason": "TPOT 太高"}),
    ("否决 {n} 因为太贵", R, {"candidate_id": 7, "reason": "太贵"}), ("驳回 {n}：没必要", R, {"candidate_id": 7}),
    ("拒绝 {n} 原因：没必要", R, {"candidate_id": 7, "reason": "没必要"}),
    ("reject {n}", R, {"candidate_id": 7, "reason": None}),  # no reason: the reply asks for one, nothing is done
    ("pause", "pause", {}), ("Pause.", "pause", {}), ("pause please", "pause", {}), ("PAUSE!", "pause", {}),
    ("hold", "pause", {}), ("暂停", "pause", {}), ("暂停。", "pause", {}), ("先停一下", "pause", {}),
    ("resume", "resume", {}), ("continue", "resume", {}), ("carry on", "resume", {}), ("继续", "resume", {}),
    ("恢复", "resume", {}), ("stop", "stop", {}), ("Stop.", "stop", {}), ("abort", "stop", {}), ("halt", "stop", {}),
    ("停止", "stop", {}), ("终止", "stop", {}), ("结束", "stop", {}),
    ("go back to the best", "restore_best", {}), ("restore best", "restore_best", {}),
    ("roll back to the best", "restore_best", {}), ("回到最佳", "restore_best", {}), ("回滚到最优", "restore_best", {}),
    ("status", "status", {}), ("status?", "status", {}), ("状态", "status", {}), ("how's it going", "status", {}),
    ("how’s it going?", "status", {}), ("进度", "status", {}),
    ("why was {n} rejected?", "why_rejected", {"candidate_id": 7}),
    ("为什么拒绝了 {n}", "why_rejected", {"candidate_id": 7}), ("{n} 为什么被拒绝", "why_rejected", {"candidate_id": 7}),
    ("extend budget by 10 card-hours", "extend_budget", {"card_hours": 10.0}),
    ("extend the budget by 2.5 card-hours and 3 experiments", "extend_budget", {"card_hours": 2.5, "experiments": 3}),
    ("add 4 card-hours", "extend_budget", {"card_hours": 4.0}),
    ("预算增加 5 卡时", "extend_budget", {"card_hours": 5.0}),
    ("refuse the extension because enough", "refuse_extension", {"reason": "enough"}),
    ("refuse the extension", "refuse_extension", {"reason": None}), ("no extension", "refuse_extension", {}),
    ("拒绝追加预算", "refuse_extension", {}), ("不追加预算 因为 够了", "refuse_extension", {"reason": "够了"}),
    ("one more round at C90", "one_more_round", {"count": 1, "knobs": {"concurrency": 90}}),
    ("two more rounds at C=64", "one_more_round", {"count": 2, "knobs": {"concurrency": 64}}),
    ("one more round at C 64", "one_more_round", {"knobs": {"concurrency": 64}}),
    ("one more round at concurrency 32", "one_more_round", {"knobs": {"concurrency": 32}}),
    ("one more round at C90 r=7.5", "one_more_round", {"knobs": {"concurrency": 90, "request_rate": 7.5}}),
    ("one more round at r=6", "one_more_round", {"knobs": {"request_rate": 6.0}}),
    ("one more round at r=6.", "one_more_round", {"knobs": {"request_rate": 6.0}}),  # a final '.' is punctuation
    ("one more round at Ｃ９０", "one_more_round", {"knobs": {"concurrency": 90}}),
    ("再跑一轮 C90", "one_more_round", {"knobs": {"concurrency": 90}}),
    ("再跑两轮 并发 32", "one_more_round", {"count": 2, "knobs": {"concurrency": 32}}),
    ("one more round", "one_more_round", {"count": 1, "knobs": {}}), ("3 more rounds", "one_more_round", {"count": 3}),
]

# not commands and naming nothing: the help (or a configured language model) answers
UNKNOWN = ["what a nice day", "hello there", "", "?", "help", "thanks!", "👍", "ok", "what's up?", "how are the numbers", "🙂🙂🙂"]


def rows(n: int = 7, m: int = 8) -> list[tuple[str, str, dict]]:
    """Every row with its candidates filled in: (text, kind, fields)."""
    out = [(t.format(n=n, m=m), REF, {}) for t in NOT_COMMANDS]
    out += [(t.format(n=n, m=m), k, {f: (n if f == "candidate_id" else v) for f, v in fields.items()})
            for t, k, fields in COMMANDS]
    return out + [(t, UNK, {}) for t in UNKNOWN]

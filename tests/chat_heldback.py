"""The held-back table (no tests here): utterances of the same kinds as tests/chat_table.py's, written after the
grammar was done and never used to shape it. Each must act on nothing; `{n}` is the waiting candidate, `{m}`
another. tests/test_chat_grammar.py and tests/test_chat_exact_serve.py run them like the main table."""
from __future__ import annotations

HELD_BACK = [
    # questions and requests for confirmation
    "approve {n} maybe?", "you approving {n}?", "approve {n}, yes?", "approve {n} y/n", "approve {n} (?)",
    "approve {n} or wait?", "do I need to approve {n}", "is it safe to approve {n}", "approve {n}, thoughts?",
    "批准 {n} 可以吗", "能批准 {n} 吗", "{n} 批准了吗", "要不要批准 {n}", "批准 {n} 行不行", "批准 {n}?",
    # negations and reversals, curly and straight
    "I don’t want to approve {n}", "let’s not approve {n}", "we can’t approve {n} today", "approve {n} — NOT",
    "approve {n} (not really)", "approve {n}, actually don’t", "on second thought don’t approve {n}",
    "approve {n} psych", "approve {n}… nope", "approve {n}, scratch that", "never mind, approve {n}",
    "don’t pause", "please don’t stop", "不用批准 {n}", "先不要批准 {n}", "不能批准 {n}", "还是别批准 {n} 了",
    "批准 {n}，算了", "甭批准 {n}", "无需批准 {n}",
    # hedges, conditions, times, politeness that is more than "please"
    "approve {n} after the next run", "approve {n} at 5pm", "approve {n} by EOD", "approve {n} next week",
    "approve {n} once p99 is in", "approve {n} provided TTFT holds", "approve {n} assuming the SLO holds",
    "kindly approve {n} when you can", "go ahead with {n} if nobody objects", "lgtm {n} pending review",
    "lgtm {n} modulo the TPOT", "approve {n} 🙏", "approve {n} ✅", "✅ approve {n}", "approve {n} 😀😀",
    "approve {n} lol", "approve {n} — thanks!", "批准 {n} 谢谢", "晚点批准 {n}", "下午批准 {n}", "等跑完再批准 {n}",
    "批准 {n} 如果 TTFT 正常",
    # two targets or two commands
    "approve {n} plus {m}", "approve {n} as well as {m}", "approve {n}/{m}", "approve {n}-{m}", "approve {n}+{m}",
    "approve {n} too, and {m}", "approve both {n} and {m}", "approve {n}, then stop", "reject {m}, approve {n}",
    "批准 {n} 以及 {m}", "批准 {n}/{m}", "批准 {n} 并 暂停",
    # mode words that are not a mode command
    "stop it with {n}", "stop bugging me about {n}", "pause on approving {n}", "hold {n} for now", "hold that thought",
    "let's pause here?", "could we stop", "pause for a sec maybe", "stop soon", "resume later", "continue tomorrow",
    "stop after {n}", "pause after {n}", "resume once {n} is approved", "暂停一下 {n}", "停一下 {n}", "继续吗",
    "明天继续", "停止 {n} 的审批",
    # numbers that are no candidate
    "approve {n}th", "approve {n}%", "approve ${n}", "approve {n}k", "approve {n}.0", "approve v{n}",
]

"""What a message that is not exactly a command gets: nothing done, and the exact command it may have meant.

A message that mentions a command word ("approve", "stop", "批准", "轮", any inflection: "approving", "stopped") or a
candidate number but is not one sentence of the grammar is `refused`: a question ("approve 7?", "批准 7 吗"), a
hedge or condition ("approve 7 if TTFT stays low"), a time ("approve 7 later"), a second target ("approve 7 and
8"), a negation in any language ("don't approve 7", "I wouldn't approve 7", "别批准 7"). The reply says why and
offers the one exact command it may have meant (`suggest`: sent or clicked as it is, it acts); a negated approval
is offered no approval. A first word that is a near miss of a command word ("aprove 5") is offered that command
("approve 5"), never acted on. A fixed number of regular-expression searches of bounded literals: linear in the message.
"""
from __future__ import annotations

import difflib
import re
from typing import Any

from api.chat_intent import Intent

# each an alternation of literals searched in the case-folded message (no look-behind before the literal, which
# would defeat the regex engine's literal scan): a fixed number of searches, linear in the message's length. A word
# that merely contains one ("nonstop") counts as a mention: it only turns "unknown" into "refused" (neither acts).
_E = r"(?![^\W\d_])"
_KINDS = {
    "approve": r"approv|accept|lgtm|go ahead|批准|同意|通过|可以跑",
    "reject": r"reject|declin|deny|denied|veto|拒绝|否决|驳回",
    "pause": rf"paus|hold{_E}|暂停|停一下",
    "resume": r"resum|unpaus|continu|carry on|继续|恢复",
    "stop": r"stop|halt|abort|停止|结束|终止",
    "one_more_round": rf"rounds?{_E}|轮",
    "restore_best": rf"restor|roll ?back|best{_E}|最佳|最优",
    "extend_budget": r"budget|extend|extension|预算|卡时",
}
_KIND_RES = {k: re.compile(v) for k, v in _KINDS.items()}
_NEGATED = re.compile(r"\b(?:not|no|never|nope|nah|neither|nor|without|nicht|kein|keine|nein|non|pas|jamais|nunca"
                      r"|nada|ne|nie|нет|не)\b|n't\b|cannot\b|disapprov|ない|없|不|别|勿|没|未|莫|甭|禁止|无需|无须")
_QUESTION = re.compile(r"\?|吗|嘛|呢")
# the command words a first word is compared with for a typo (api/chat.py's English verbs)
_TYPO_WORDS = ("approve", "reject", "pause", "resume", "stop")
_NUMBER = re.compile(r"(?<![0-9.])[0-9]{1,9}(?![0-9])")


def _mentions(said: str) -> tuple[list[str], list[int], bool, bool]:
    """(command kinds named, the first candidate numbers named (two at most), negated, a question)."""
    said = said.casefold()
    kinds = [k for k, r in _KIND_RES.items() if r.search(said)]
    nums: list[int] = []
    for m in _NUMBER.finditer(said):
        if int(m.group()) not in nums and int(m.group()) > 0:  # candidate ids start at 1
            nums.append(int(m.group()))
            if len(nums) > 1:
                break
    return kinds, nums, _NEGATED.search(said) is not None, _QUESTION.search(said) is not None


def misspelt(said: str) -> tuple[str, str] | None:
    """(the word typed, the command word it is a typo of) when the message opens with a near miss of one
    ("aprove 5", "rejct 5 because …", "pasue"): difflib's ratio at least 0.8 ("step" or "shop" are no "stop"), never
    the word itself."""
    words = said.casefold().split(maxsplit=1)
    first = words[0] if words else ""
    if not 4 <= len(first) <= 20 or first in _TYPO_WORDS:
        return None
    near = difflib.get_close_matches(first, _TYPO_WORDS, n=1, cutoff=0.8)
    return (first, near[0]) if near else None


def not_a_command(said: str) -> Any:
    """`refused` with why and the command it may have meant, when the message names a command or a candidate
    (or opens with a misspelt command word); `unknown` otherwise (the reply is the help, or a configured language
    model is asked)."""
    kinds, nums, negated, question = _mentions(said)
    typo = misspelt(said) if not kinds else None
    if typo is not None:
        kinds = [typo[1]]
    if not kinds and not nums:
        return Intent(kind="unknown")
    if typo is not None and not negated and not question and len(nums) <= 1:
        why = f"{typo[0]!r} is not a command word (did you mean {typo[1]!r}?)"
    elif negated:
        why = "it negates the command"
    elif question:
        why = "it is a question"
    elif len(nums) > 1:
        why = f"it names more than one candidate ({nums[0]}, {nums[1]}, …); one per message"
    elif len(kinds) > 1:
        why = f"it names {len(kinds)} commands ({', '.join(k.replace('_', ' ') for k in kinds)}); one per message"
    else:
        why = "it is not exactly one command: nothing may come before or after it (a hedge, a condition, a time)"
    suggest, hint = None, None
    only = kinds[0] if len(kinds) == 1 else None
    if only == "approve" and len(nums) == 1:
        suggest, hint = (None, f"reject {nums[0]} because …") if negated else (f"approve {nums[0]}", None)
    elif only == "reject" and len(nums) == 1 and not negated:
        hint = f"reject {nums[0]} because …"
    elif only in ("pause", "resume", "stop") and not nums and not negated:
        suggest = only
    elif only == "restore_best" and not nums and not negated:
        suggest = "go back to the best"
    elif not kinds and len(nums) == 1:
        hint = f"approve {nums[0]}' or 'reject {nums[0]} because …"
    reply = f"not done: {why}; nothing changed."
    if suggest:
        reply += f" To act, send exactly '{suggest}'."
    elif hint:
        reply += f" To act, send exactly '{hint}'."
    else:
        reply += " Commands are exact, one per message: say 'help' for the list."
    return Intent(kind="refused", reason=reply[:2000], suggest=suggest)

"""The one check of a person's reason (a rejection, a refused extension, a note on an approval), used by the store and
by every channel before it (REST, the chat, Slack, Feishu, the dashboard, the CLI): the same reasons refused with the
same words, the same text stored.

A reason must say something: blank, punctuation-only and emoji-only text is no reason ("👎", "...", "?!"), and a
decision recorded with it would carry nothing a reader can act on. It is judged as it is stored: its white space
folded first (runs of any Unicode space or line break become one space, none at either end), then at least one
letter or number that renders (Unicode categories L and N) and at most MAX_REASON characters. Not a word: the
Hangul fillers (letters of category Lo that are drawn as nothing), a letter or digit under an enclosing mark (the
keycap digits "1️⃣": a digit, a variation selector, U+20E3), format characters (Cf: zero-width spaces, joiners). Control
characters and lone surrogates are refused outright: no store keeps them as text.
"""
from __future__ import annotations

import unicodedata

from core.errors import FieldError

MAX_REASON = 500
NO_REASON = ("must say why in words (at least one letter or digit); a blank, punctuation-only or emoji-only reason "
             "is refused")
# letters (category Lo) that are drawn as blank space: Hangul choseong / jungseong fillers, the Hangul filler and
# its halfwidth form
FILLERS = frozenset("\u115f\u1160\u3164\uffa0")
_SELECTORS = frozenset(chr(c) for c in range(0xFE00, 0xFE10))  # variation selectors: U+FE0F asks for the emoji form


def fold(reason: str | None) -> str:
    """The reason as it is judged and stored: white space folded to single spaces, none at either end."""
    return " ".join((reason or "").split())


def says_something(text: str) -> bool:
    """At least one letter or number that renders as one: not a filler, not enclosed by a mark (a keycap)."""
    for i, ch in enumerate(text):
        if unicodedata.category(ch)[0] not in "LN" or ch in FILLERS:
            continue
        j = i + 1
        while j < len(text) and text[j] in _SELECTORS:
            j += 1
        if j < len(text) and unicodedata.category(text[j]) == "Me":
            continue  # "1️⃣", "a⃝": a symbol drawn around a character, not a word
        return True
    return False


def _problem(said: str) -> str | None:
    if bad := next((ch for ch in said if unicodedata.category(ch) in ("Cc", "Cs")), None):
        return f"must not hold control characters or lone surrogates, got U+{ord(bad):04X}"
    if not says_something(said):
        return NO_REASON
    if len(said) > MAX_REASON:
        return f"at most {MAX_REASON} characters once its white space is folded, got {len(said)}"
    return None


def reason_problem(reason: str | None) -> str | None:
    """Why this text is no reason, as a person reads it ("reason: ..."; the shared words), else None."""
    why = _problem(fold(reason))
    return None if why is None else f"reason: {why}"


def check_reason(reason: str | None, required: bool = True) -> str | None:
    """The reason with its white space folded (`fold`); None when none was given and none is required; FieldError
    (its field `reason`) for text that says nothing, or none where one is required."""
    if reason is None and not required:
        return None
    said = fold(reason)
    if (why := _problem(said)) is not None:
        raise FieldError("reason", why)
    return said

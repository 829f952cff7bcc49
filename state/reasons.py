"""The one check of a person's reason (a rejection, a refused extension, a note on an approval), used by the store so
that REST, the chat, Slack, Feishu, the dashboard and the CLI all refuse the same reasons with the same words.

A reason must say something: blank, punctuation-only and emoji-only text is no reason ("👎", "...", "?!"), and a
decision recorded with it would carry nothing a reader can act on. At least one letter or digit, in any script.
"""
from __future__ import annotations

from core.errors import FieldError

MAX_REASON = 500
NO_REASON = ("must say why in words (at least one letter or digit); a blank, punctuation-only or emoji-only reason "
             "is refused")


def _problem(reason: str | None) -> str | None:
    said = " ".join((reason or "").split())
    if not any(ch.isalnum() for ch in said):
        return NO_REASON
    if len(said) > MAX_REASON:
        return f"at most {MAX_REASON} characters, got {len(said)}"
    return None


def reason_problem(reason: str | None) -> str | None:
    """Why this text is no reason, as a person reads it ("reason: ..."; the shared words), else None."""
    why = _problem(reason)
    return None if why is None else f"reason: {why}"


def check_reason(reason: str | None, required: bool = True) -> str | None:
    """The reason with its white space collapsed; None when none was given and none is required; FieldError
    (its field `reason`) for text that says nothing, or none where one is required."""
    if reason is None and not required:
        return None
    if (why := _problem(reason)) is not None:
        raise FieldError("reason", why)
    return " ".join((reason or "").split())

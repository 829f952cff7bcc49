"""The chat grammar's result and what its sentences share: the `Intent` a message parses to, the phrases every
sentence may use (a reason's separators, counts), and a reason checked with the words every channel uses.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.chat_words import phrases
from state.reasons import fold, reason_problem

IntentKind = Literal["approve", "reject", "pause", "resume", "stop", "one_more_round", "restore_best", "status",
                     "why_rejected", "extend_budget", "refuse_extension", "refused", "unknown"]
ACTING = ("approve", "reject", "pause", "resume", "stop", "one_more_round", "restore_best", "extend_budget",
          "refuse_extension")


class Intent(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: IntentKind
    candidate_id: int | None = Field(None, ge=1)
    card_hash: str | None = Field(None, pattern=r"^[0-9a-f]{16}$")
    reason: str | None = Field(None, max_length=2000)
    count: int | None = Field(None, ge=1, le=20)
    knobs: dict[str, Any] = Field(default_factory=dict)
    card_hours: float | None = Field(None, ge=0, le=1e6)  # extend_budget
    experiments: int | None = Field(None, ge=0, le=10_000)
    suggest: str | None = Field(None, max_length=300)  # refused: the exact command it may have meant


W = phrases
BECAUSE = W("because", ":", "因为", "原因:", "原因是")
NUMBERS = {"one": 1, "a": 1, "another": 1, "two": 2, "three": 3, "four": 4, "five": 5,
        "一": 1, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5}
COUNT_WORDS = W(*(w for w in NUMBERS if w.isascii()))
CN_COUNT = W(*(w for w in NUMBERS if not w.isascii()))


def with_reason(intent: Intent, said: str) -> Intent:
    """A decision with its reason, or refused (with the words every channel uses) when the reason says nothing."""
    if (why := reason_problem(said)) is not None:
        return Intent(kind="refused", reason=f"not done: {why}; nothing changed")
    return intent.model_copy(update={"reason": fold(said)})

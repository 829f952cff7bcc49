"""Authorisation: who may start what. Pure functions over the goal's authorisation table.

`decide` answers auto / ask / deny for one step with the reasons; the strictest action class of a
step wins, and a step that would exceed the budget is never `auto` (it needs a budget extension).
Instructions ("pause", "one more round at C90") are validated and interpreted here too.
"""
from __future__ import annotations

from typing import Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict

from core.errors import FieldError
from core.knobs import KnobError, catalog
from state.goal import ACTION_CLASSES

Permission = Literal["auto", "ask", "deny"]
_RANK = {"auto": 0, "ask": 1, "deny": 2}
INSTRUCTION_KINDS = ("pause", "resume", "stop", "one_more_round", "restore")


class AuthDecision(BaseModel):
    model_config = ConfigDict(frozen=True)
    permission: Permission
    reasons: tuple[str, ...]


def decide(action_class: str | Iterable[str], table: dict[str, str], budget_left: float | None,
           estimated_cost: float | None, *, experiments_left: int | None = None,
           deadline_passed: bool = False) -> AuthDecision:
    """auto / ask / deny for a step of these action classes costing `estimated_cost` card-hours."""
    classes = [action_class] if isinstance(action_class, str) else list(action_class)
    if not classes:
        raise FieldError("action_class", "at least one action class is needed")
    perm, reasons = "auto", []
    for c in classes:
        if c not in ACTION_CLASSES:
            raise FieldError("action_class", f"unknown {c!r}; known: {list(ACTION_CLASSES)}")
        p = table.get(c, "ask")
        reasons.append(f"authorisation table: {c} -> {p}")
        perm = max(perm, p, key=_RANK.__getitem__)
    over = []
    if estimated_cost is not None and budget_left is not None and estimated_cost > budget_left:
        over.append(f"estimated {estimated_cost:.3f} card-hours exceeds the {max(budget_left, 0):.3f} left")
    if experiments_left is not None and experiments_left <= 0:
        over.append("no experiments left in the budget")
    if deadline_passed:
        over.append("the deadline has passed")
    if over:
        ext = table.get("budget_extension", "ask")
        ext = "ask" if ext == "auto" else ext  # never exceed the budget without a person saying so
        reasons += over + [f"budget_extension -> {ext}"]
        perm = max(perm, ext, key=_RANK.__getitem__)
    return AuthDecision(permission=perm, reasons=tuple(reasons))  # type: ignore[arg-type]


def validate_instruction(kind: str, count: int | None,
                         knobs: dict[str, Any] | None) -> tuple[int | None, dict[str, Any]]:
    """Check an instruction; returns its round count (one_more_round defaults to 1, others None) and its knobs as
    validated (each in its knob's type): what is stored is what was checked, never the text as sent."""
    if kind not in INSTRUCTION_KINDS:
        raise FieldError("kind", f"must be one of {list(INSTRUCTION_KINDS)}, got {kind!r}")
    if kind == "one_more_round":
        count = 1 if count is None else count
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise FieldError("count", f"must be a positive integer, got {count!r}")
    elif count is not None:
        raise FieldError("count", f"only one_more_round takes a count, not {kind}")
    try:
        return count, catalog().validate(dict(knobs or {}))
    except KnobError as e:
        raise FieldError(f"knobs.{e.knob}", e.reason) from None


def instruction_effect(instruction: Any) -> Literal["run", "pause", "stop", "restore"]:
    """What the loop may do next under the instruction in force (None = no instruction: run)."""
    if instruction is None or instruction.kind == "resume":
        return "run"
    if instruction.kind in ("pause", "stop", "restore"):
        return instruction.kind
    return "run" if (instruction.remaining or 0) > 0 else "stop"  # one_more_round: exactly `count` rounds

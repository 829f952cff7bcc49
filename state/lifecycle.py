"""Status lifecycles of candidates, runs and goals, checked in ONE place (optuna's TrialState style).

Every status change in the store goes through `check(entity, old, new)`; nothing else decides
which transitions are legal.
"""
from __future__ import annotations

from enum import Enum, StrEnum

from state.errors import InvalidTransition


class CandidateStatus(StrEnum):
    """Where a card stands; the store's column keeps the value (a StrEnum compares equal to its string)."""

    PROPOSED = "proposed"
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    REJECTED = "rejected"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    UNKNOWN = "unknown"
    CANCELLED = "cancelled"


class RunStatus(StrEnum):
    """Where a run stands (`unknown`: after an unclear fault, its target takes no work until re-verified)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    UNKNOWN = "unknown"


class GoalStatus(StrEnum):
    """Where a goal stands."""

    RUNNING = "running"
    WAITING = "waiting"
    PAUSED = "paused"
    STOPPED = "stopped"
    DONE = "done"


TRANSITIONS: dict[str, dict[str, frozenset[str]]] = {
    "candidate": {
        "proposed": frozenset({"awaiting_approval", "approved", "rejected", "cancelled"}),
        "awaiting_approval": frozenset({"approved", "rejected", "cancelled"}),
        "approved": frozenset({"running", "cancelled"}),
        # a fault resumes at the failed phase: failed -> running again
        "running": frozenset({"done", "failed", "unknown"}),
        "failed": frozenset({"running", "cancelled"}),
        "unknown": frozenset({"running", "done", "failed", "cancelled"}),
        "done": frozenset(),
        "rejected": frozenset(),
        "cancelled": frozenset(),
    },
    "run": {
        "pending": frozenset({"running", "failed", "unknown"}),
        "running": frozenset({"done", "failed", "unknown"}),
        "failed": frozenset({"running"}),
        "unknown": frozenset({"running", "done", "failed"}),
        "done": frozenset(),
    },
    "goal": {
        "running": frozenset({"waiting", "paused", "stopped", "done"}),
        "waiting": frozenset({"running", "paused", "stopped", "done"}),
        "paused": frozenset({"running", "stopped"}),
        "stopped": frozenset({"running"}),  # a person may restart a stopped goal (resume, one more round)
        "done": frozenset({"running"}),
    },
}
TERMINAL_CANDIDATE = frozenset({"done", "rejected", "cancelled"})
UNDECIDED = (CandidateStatus.PROPOSED, CandidateStatus.AWAITING_APPROVAL)  # a card no one has decided yet
STARTED = (CandidateStatus.RUNNING, CandidateStatus.FAILED, CandidateStatus.UNKNOWN)  # a card whose run began
SET_ASIDE = (CandidateStatus.REJECTED, CandidateStatus.CANCELLED)  # a card decided never to run


class WaitingFor(str, Enum):
    """What a waiting goal waits for (its status reason's kind): the code branches on this, people read the reason."""

    APPROVAL = "approval"  # a person's decision on a card
    BUDGET_EXTENSION = "budget_extension"  # a person's grant (or refusal) of a budget extension


class OutcomeKind(str, Enum):
    """What became of an instruction (its outcome's kind); the value is how its outcome's words begin."""

    DONE = "done"  # carried out
    NOT_DONE = "not done"  # the loop stopped before it was carried out in full
    FAILED = "failed"  # carried out, and it failed (a restore whose station did not come back healthy)
    REFUSED = "refused"  # could not be carried out (or changes nothing: one of its kind goes first)
    SUPERSEDED = "superseded"  # a later instruction replaced it before it took effect


def check(entity: str, old: str, new: str) -> None:
    """Raise InvalidTransition unless old -> new is allowed; a no-op change (old == new) is allowed."""
    table = TRANSITIONS[entity]
    if new not in table:
        raise InvalidTransition(entity, old, new, sorted(table.get(old, ())))
    if old == new:
        return
    allowed = table.get(old, frozenset())
    if new not in allowed:
        raise InvalidTransition(entity, old, new, sorted(allowed))

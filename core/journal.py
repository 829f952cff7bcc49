"""What the executor needs from durable storage: a phase journal, fenced leases and the targets' UNKNOWN state.

`state.store.Store` implements these protocols; the executor only ever sees these names, so the
import rule (executor never imports state) holds and a test can pass any implementation.
"""
from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

PhaseEvent = Literal["intent", "outcome"]


class PhaseStatus(StrEnum):
    """A phase record's status: an intent is always written `started`, an outcome one of the others; the journal
    keeps the value (a StrEnum compares equal to its string)."""

    STARTED = "started"
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"
    UNKNOWN = "unknown"


class PhaseRecord(BaseModel):
    """One durable line of a run's history: a phase's intent (before) or outcome (after its effect)."""

    model_config = ConfigDict(frozen=True, extra="allow")
    run_id: str
    phase: str
    event: PhaseEvent
    status: str
    epoch: int
    target: str
    detail: dict[str, Any] | None = Field(default=None)
    error_class: str | None = None
    seq: int | None = None  # storage order, when the store keeps one
    at: datetime | None = None


@runtime_checkable
class Journal(Protocol):
    def record_phase(self, run_id: str, phase: str, event: str, status: str, *, epoch: int, target: str,
                     detail: dict[str, Any] | None = None, error_class: str | None = None) -> Any:
        """Append one record; refuses (raises StaleEpoch) when `epoch` is not the target's current one."""

    def phases(self, run_id: str) -> list[Any]:
        """Every record of the run in the order written (PhaseRecord or an object with its fields)."""


@runtime_checkable
class Leases(Protocol):
    def acquire_lease(self, target: str, holder: str, ttl_s: float) -> int | None:
        """A new, strictly larger epoch, or None while another live holder has the target."""

    def renew_lease(self, target: str, holder: str, epoch: int, ttl_s: float) -> bool: ...

    def release_lease(self, target: str, holder: str, epoch: int) -> None: ...

    def current_epoch(self, target: str) -> int: ...


@runtime_checkable
class TargetStates(Protocol):
    """The UNKNOWN state of targets, kept by the store (its run status) and nowhere else."""

    def unknown_targets(self) -> dict[str, str]:
        """Target -> why it is UNKNOWN; no work is issued to these until a person clears them."""

    def mark_unknown(self, spec: Any, why: str) -> Any:
        """The run (a TrialSpec) and so its target are UNKNOWN after an unclear fault."""

    def clear_unknown(self, target: str, who: str, why: str = "") -> list[str]:
        """A person re-verified the target; the ids of the runs that were UNKNOWN on it."""


def is_stale_epoch(exc: BaseException) -> bool:
    """True for the store's StaleEpoch refusal (matched by name: the executor never imports state)."""
    return any(c.__name__ == "StaleEpoch" for c in type(exc).__mro__)


def as_record(obj: Any) -> PhaseRecord:
    """Normalise whatever the store hands back (model, dataclass, row) into a PhaseRecord."""
    if isinstance(obj, PhaseRecord):
        return obj
    if isinstance(obj, dict):
        return PhaseRecord.model_validate(obj)
    if hasattr(obj, "model_dump"):
        return PhaseRecord.model_validate(obj.model_dump())
    fields = ("run_id", "phase", "event", "status", "epoch", "target", "detail", "error_class", "seq", "at")
    return PhaseRecord.model_validate({f: getattr(obj, f, None) for f in fields})


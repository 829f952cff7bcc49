"""The loop's LangGraph state: only ids and small JSON, because it is checkpointed (msgpack) and the store, not
the checkpoint, is the record of truth (docs/architecture.md, "The loop's state")."""
from __future__ import annotations

from typing import Any, TypedDict


class LoopState(TypedDict, total=False):
    goal_id: str
    candidate_id: int | None
    run_id: str | None
    stop_reason: str | None  # why the loop stops, as the node that sent it to `stop` said it
    stop_said: str | None  # what the stop recorded: the reason and what the tooling's faults cost (stop node)
    stop_status: str | None
    stop_by: str | None  # who asked for the stop (a pause, a stop, rounds): "name (via)"; cleared by the stop node
    diagnosis: str | None
    diagnosis_data: dict[str, Any] | None  # the Diagnosis as JSON: propose plans from this one

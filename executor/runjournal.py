"""One run's phase journal inside the executor: written through to the store, kept in memory for the run."""
from __future__ import annotations

from typing import Any

from core.journal import Journal, PhaseRecord, PhaseStatus, is_stale_epoch


class LostLease(RuntimeError):
    """Our lease was taken over (we were paused or partitioned): stop touching the target."""


class RunJournal:
    """One run's phase records: written through to the store with the lease epoch, kept in memory for the run.

    The records an earlier invocation wrote are read once, when the run starts; everything this invocation
    writes is appended here too, so no phase re-reads the store to learn what happened before it.
    """

    def __init__(self, store: Journal, run_id: str, target: str, earlier: list[PhaseRecord]):
        self.store, self.run_id, self.target = store, run_id, target
        self.earlier = list(earlier)
        self.records = list(earlier)
        self.epoch = 0

    def record(self, phase: str, event: str, status: str, detail: dict | None = None,
               error_class: str | None = None) -> None:
        try:
            self.store.record_phase(self.run_id, phase, event, status, epoch=self.epoch, target=self.target,
                                    detail=detail, error_class=error_class)
        except Exception as e:  # noqa: BLE001 - only the store's StaleEpoch is turned into LostLease
            if is_stale_epoch(e):
                raise LostLease(f"run {self.run_id}: journal refused epoch {self.epoch}: {e}") from e
            raise
        self.records.append(PhaseRecord(run_id=self.run_id, phase=phase, event=event, status=status,  # type: ignore[arg-type]
                                        epoch=self.epoch, target=self.target, detail=detail, error_class=error_class))

    def ok_before(self) -> set[str]:
        """Phases whose outcome an earlier invocation of this run recorded ok."""
        return {r.phase for r in self.earlier if r.event == "outcome" and r.status == PhaseStatus.OK}

    def began_before(self, phase: str) -> bool:
        return any(r.phase == phase and r.event == "intent" for r in self.earlier)

    def ok_detail(self, phase: str) -> dict[str, Any]:
        """The detail of the first ok outcome of `phase` in this run ({} when there is none)."""
        return next((r.detail or {} for r in self.records
                     if r.phase == phase and r.event == "outcome" and r.status == PhaseStatus.OK), {})

    def current_phase(self) -> str:
        return self.records[-1].phase if self.records else "prepare"

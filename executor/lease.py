"""The target lease of one run: lock (intent, acquire, fence the target), renew, release.

The epoch only grows; the journal writes with it and the target-side launcher refuses anything older,
so a paused or partitioned holder can neither write nor launch once another holder took the target.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from executor.phases import ExecSettings, PhaseFailure, crashpoint
from executor.runjournal import LostLease, RunJournal


class TargetLease:
    def __init__(self, leases: Any, journal: RunJournal, settings: ExecSettings, transport: Any):
        self.leases, self.journal, self.s, self.transport = leases, journal, settings, transport

    @property
    def epoch(self) -> int:
        return self.journal.epoch

    async def lock(self) -> None:
        tgt = self.journal.target
        for _ in range(100):  # the intent carries the epoch current now; another holder may move it meanwhile
            self.journal.epoch = self.leases.current_epoch(tgt)
            try:
                self.journal.record("lock", "intent", "started", {"holder": self.s.holder})
                break
            except LostLease:
                await asyncio.sleep(0.01)
        else:
            raise PhaseFailure("lock_timeout", f"target {tgt!r}: could not record the lock intent")
        deadline = time.monotonic() + self.s.lock_wait_s
        delay = 0.05
        while True:
            ep = self.leases.acquire_lease(tgt, self.s.holder, self.s.lease_ttl_s)
            if ep is not None:
                break
            if time.monotonic() > deadline:
                raise PhaseFailure("lock_timeout", f"target {tgt!r}: lease not free within {self.s.lock_wait_s:g}s")
            await asyncio.sleep(delay)  # waiting for another holder's lease, not synchronising a test
            delay = min(delay * 2, 1.0)
        self.journal.epoch = ep
        crashpoint("lock", "after")
        await self.transport.fence(ep)  # the target learns the new epoch before anything else happens
        self.journal.record("lock", "outcome", "ok", {"holder": self.s.holder, "epoch": ep})
        crashpoint("lock", "done")

    async def renew(self) -> None:
        if not self.leases.renew_lease(self.journal.target, self.s.holder, self.epoch, self.s.lease_ttl_s):
            raise LostLease(f"target {self.journal.target!r}: lease at epoch {self.epoch} was lost")

    async def release(self, healthy: bool) -> None:
        self.journal.record("release", "intent", "started", {"healthy_after": healthy})
        crashpoint("release", "before")
        # the outcome goes in first: once the lease is given up, another holder may move the epoch at once
        # and a write with ours is (rightly) refused. A crash in between leaves a lease that expires by TTL.
        self.journal.record("release", "outcome", "ok", {"healthy_after": healthy})
        self.leases.release_lease(self.journal.target, self.s.holder, self.epoch)

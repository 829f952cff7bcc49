"""One invocation of one trial: the phase machine, driven by a declarative phase table.

    lock -> prepare -> deploy -> health -> warmup -> load [-> profile] -> collect -> validate -> release

Each phase writes an intent record before its side effect and an outcome after it, both carrying the lease
epoch (executor/runjournal.py, executor/lease.py). Side-effecting phases whose outcome an earlier invocation
recorded ok are never redone; pure ones are recomputed. What differs between targets (virtual clock or real,
cost model, profile capture, source identity, cards in use) is the transport's: no phase asks which target
it runs on. The phases themselves live by group: executor/phase_deploy.py, phase_load.py, phase_collect.py.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from core.station import Station
from core.trial import CostEntry, TrialResult, TrialSpec
from executor.lease import TargetLease
from executor.phase_collect import CollectPhases
from executor.phase_deploy import DeployPhases
from executor.phase_load import LoadPhases
from executor.phases import ExecSettings, PhaseFailure, UnknownState, crashpoint
from executor.runjournal import LostLease, RunJournal
from executor.targets import Target
from executor.templates import Rendered
from executor.transports.base import StaleLaunch, Transient


@dataclass(frozen=True)
class PhaseStep:
    """One side-effecting phase between prepare and collect: its name, its method, when it applies."""

    name: str
    method: str
    applies: Callable[[TrialSpec], bool] = lambda spec: True


# never redone once recorded ok: a resumed run reads the recorded outcome instead
SIDE_EFFECT_PHASES = (
    PhaseStep("deploy", "deploy"),
    PhaseStep("health", "health"),
    PhaseStep("warmup", "warmup"),
    PhaseStep("load", "load"),
    PhaseStep("profile", "profile", lambda spec: spec.profile_capture),
)


class TrialRun(DeployPhases, LoadPhases, CollectPhases):
    def __init__(self, spec: TrialSpec, target: Target, work: Path, transport: Any, journal: RunJournal,
                 lease: TargetLease, settings: ExecSettings):
        self.spec, self.target, self.work, self.transport = spec, target, work, transport
        self.journal, self.lease, self.s = journal, lease, settings
        self.ok_before = journal.ok_before()
        self.costs: list[CostEntry] = []
        self._progress_at = 0.0  # when the load's requests were last counted (note_progress)
        self.station: Station | None = None
        self.rendered: Rendered | None = None
        self.zero_cache = False

    @property
    def epoch(self) -> int:
        return self.journal.epoch

    async def renew(self) -> None:
        await self.lease.renew()

    async def phase(self, name: str, fn: Callable[[], Awaitable[dict]], intent: dict | None = None) -> dict:
        await self.renew()
        self.journal.record(name, "intent", "started", intent)
        crashpoint(name, "before")
        t0 = time.perf_counter_ns()
        try:
            detail = await asyncio.wait_for(fn(), timeout=self.s.timeout(name))
        except asyncio.TimeoutError:
            err = PhaseFailure("timeout", f"{name}: no outcome within {self.s.timeout(name):g}s")
            self.journal.record(name, "outcome", "failed", {"error": str(err)}, err.error_class)
            raise err from None
        except UnknownState as e:
            self.journal.record(name, "outcome", "unknown", {"error": str(e)}, e.error_class)
            raise
        except PhaseFailure as e:
            self.journal.record(name, "outcome", "failed", {"error": str(e)[-4000:]}, e.error_class)
            raise
        except (StaleLaunch, LostLease):
            raise
        crashpoint(name, "after")
        detail = dict(detail or {}) | {"seconds": (time.perf_counter_ns() - t0) / 1e9}
        self.journal.record(name, "outcome", "ok", detail)
        crashpoint(name, "done")
        return detail

    async def body(self) -> TrialResult:
        """The phases between lock and release; a fault becomes a verdict, never an exception."""
        try:
            prep = await self.phase("prepare", self.prepare)
        except PhaseFailure as e:
            return self.fault_result("prepare", "orchestration_fault", "invalid_station", str(e))
        done: dict[str, dict] = {}
        try:
            for step in SIDE_EFFECT_PHASES:
                if not step.applies(self.spec):
                    continue
                if step.name in self.ok_before:
                    done[step.name] = self.journal.ok_detail(step.name)
                    continue
                done[step.name] = await self.phase(step.name, getattr(self, step.method),
                                                   intent=self.intent_of(step.name))
        except UnknownState:
            raise
        except PhaseFailure as e:
            return self.fault_result(self.journal.current_phase(), "orchestration_fault", e.error_class, str(e), prep)
        return await self.collect_and_validate(prep, done.get("profile"))

    def intent_of(self, phase: str) -> dict | None:
        return {"key": self.load_key} if phase == "load" else None

    async def retry(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Bounded retry of transient transport errors, only around steps that are safe to repeat."""
        async for attempt in AsyncRetrying(stop=stop_after_attempt(self.s.transient_attempts),
                                           wait=wait_exponential(multiplier=0.2, max=5.0),
                                           retry=retry_if_exception_type(Transient), reraise=True):
            with attempt:
                return await fn()

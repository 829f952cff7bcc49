"""The executor as the loop and the planner see it: a port (as vLLM's `SchedulerInterface`), not the class.

`executor.runner.Executor` is the one implementation; the loop (agent/loop) holds an `ExecutorPort`, the
planner's pre-screen a `StationSimulator` (the part of it the planner may use). A capability a target may lack
is a method that says so, never an attribute probed with getattr/hasattr: `calibrated(target)` (False: no
calibrated profile, `predict_station` answers None), `twin_fitter(...)` (None: no twin on this target),
`evaluate_quality(...)` (None: no accuracy evaluation on this target).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from core.trial import TrialResult, TrialSpec


class QualityEvaluation(Protocol):
    """An accuracy evaluation of a station behind the quality gate (simulator/quality.py QualityResult is one)."""

    @property
    def score(self) -> float: ...
    @property
    def baseline(self) -> float: ...
    @property
    def passed(self) -> bool: ...
    @property
    def detail(self) -> Any: ...


@runtime_checkable
class StationSimulator(Protocol):
    """What the planner's pre-screen asks of the executor: one station simulated on a target's calibrated profile."""

    def calibrated(self, target: str) -> bool:
        """Whether `target` has a calibrated profile to simulate stations on (else `predict_station` is None)."""
        ...

    def predict_station(self, target: str, scenario: str, knobs: dict[str, Any], n: int, warmup: int = 0,
                        seed: int = 0, slos: dict[str, float] | None = None) -> dict[str, Any] | None: ...


@runtime_checkable
class ExecutorPort(StationSimulator, Protocol):
    """What the loop asks of the executor."""

    @property
    def runs_root(self) -> Path:
        """Where the runs' folders (and the goals' STATE.md) are written."""
        ...

    def run_trial(self, spec: TrialSpec) -> TrialResult:
        """Run (or finish, or return) the trial; idempotent on `spec.run_id`."""
        ...

    def station_of(self, run_id: str) -> dict[str, Any]:
        """The frozen station a run deployed (its hash, knobs and engine command)."""
        ...

    def restore(self, station: str) -> dict[str, Any]:
        """Re-deploy a frozen station (by hash or run id) and check its health."""
        ...

    def evaluate_quality(self, target: str, knobs: dict[str, Any], seed: int = 0) -> QualityEvaluation | None:
        """The accuracy evaluation behind the quality gate; None where the target offers none."""
        ...

    def twin_fitter(self, target: str, sim_profile: str | None) -> Callable[[tuple[str, ...]], Any] | None:
        """The goal's twin fitter on `target` (run ids -> the twin fitted on them, or why not); None: no twin."""
        ...

    def bind_sim_profile(self, target: str, profile: str | None) -> None:
        """Simulate a goal on a simulator target with the goal's own profile (nothing for another target)."""
        ...

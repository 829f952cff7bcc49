"""Executor settings, crash points for tests, and the pure reading of a run's phase history.

Resumption is decided here from the journal and the target's markers alone, never from memory:
load done -> collect; load never claimed -> start it; claimed but neither running nor done -> UNKNOWN.
"""
from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.journal import PhaseRecord, PhaseStatus
from core.records import default_runs_root

CRASH_ENV = "TUNELOOP_CRASH_AT"  # <phase>:<before|after|mid|done>, optional :STOP to pause instead
CRASH_SIGNAL_ENV = "TUNELOOP_CRASH_SIGNAL"  # KILL (default) or STOP
CRASH_MARK_ENV = "TUNELOOP_CRASH_MARK"  # file touched just before the signal (tests wait on it)
REPEATABLE = ("lock", "prepare", "collect", "validate", "release")  # always re-run: pure or per-invocation
SKIP_WHEN_OK = ("deploy", "health", "warmup", "load", "profile")  # side effects: never redone once ok


class ExecSettings(BaseModel):
    """The one settings object of the executor; `from_env` alone reads the environment."""

    model_config = ConfigDict(frozen=True)
    runs_root: Path = Path(".tuneloop/runs")
    holder: str = Field(default_factory=lambda: f"{socket.gethostname()}:executor")
    lease_ttl_s: float = 30.0
    lock_wait_s: float = 600.0
    poll_interval_s: float = 0.2
    # prepare holds the engine's version probe (executor/identity.py, up to 120 s: `vllm --version` imports torch,
    # over a minute on a busy host) and the rendering after it, so its budget is the probe's and more
    timeouts_s: dict[str, float] = Field(default_factory=lambda: {
        "lock": 600.0, "prepare": 300.0, "deploy": 1800.0, "health": 1800.0, "warmup": 1800.0,
        "load": 6 * 3600.0, "profile": 600.0, "collect": 600.0, "validate": 120.0, "release": 120.0})
    collect_attempts: int = Field(2, ge=1, le=10)
    transient_attempts: int = Field(3, ge=1, le=10)

    def timeout(self, phase: str) -> float:
        return self.timeouts_s.get(phase, 600.0)

    @classmethod
    def from_env(cls, **overrides: object) -> "ExecSettings":
        env: dict[str, object] = {}
        if os.environ.get("TUNELOOP_RUNS_ROOT"):
            env["runs_root"] = default_runs_root()
        if os.environ.get("TUNELOOP_HOLDER"):
            env["holder"] = os.environ["TUNELOOP_HOLDER"]
        if os.environ.get("TUNELOOP_LEASE_TTL_S"):
            env["lease_ttl_s"] = float(os.environ["TUNELOOP_LEASE_TTL_S"])
        return cls.model_validate(env | {k: v for k, v in overrides.items() if v is not None})


class PhaseFailure(Exception):
    """A phase ended without its effect; `error_class` names the verdict-relevant cause."""

    def __init__(self, error_class: str, message: str):
        super().__init__(message)
        self.error_class = error_class


class UnknownState(PhaseFailure):
    """The target's markers cannot tell what happened: stop issuing work for that target."""

    def __init__(self, message: str):
        super().__init__("unknown_state", message)


class TargetUnknown(RuntimeError):
    """Refusal to issue work to a target whose last run's state is unknown."""


def crashpoint(phase: str, when: Literal["before", "after", "mid", "done"]) -> None:
    """Kill (or pause) this process at a named point, when the test environment asks for it."""
    want = os.environ.get(CRASH_ENV)
    if not want or want != f"{phase}:{when}":
        return
    mark = os.environ.get(CRASH_MARK_ENV)
    if mark:
        Path(mark).write_text(f"{phase}:{when} {os.getpid()}\n")
    sig = signal.SIGSTOP if os.environ.get(CRASH_SIGNAL_ENV, "KILL").upper() == "STOP" else signal.SIGKILL
    if sig == signal.SIGSTOP:
        os.environ.pop(CRASH_ENV, None)  # pause once; after SIGCONT carry on to show what gets refused
    os.kill(os.getpid(), sig)


def ok_phases(records: Iterable[PhaseRecord]) -> set[str]:
    return {r.phase for r in records if r.event == "outcome" and r.status == PhaseStatus.OK}


def last_outcome(records: list[PhaseRecord], phase: str) -> PhaseRecord | None:
    for r in reversed(records):
        if r.phase == phase and r.event == "outcome":
            return r
    return None


def finished(records: list[PhaseRecord]) -> bool:
    """A run is finished once its release outcome is recorded after its last lock."""
    last_lock = max((i for i, r in enumerate(records) if r.phase == "lock" and r.event == "intent"), default=-1)
    return any(r.phase == "release" and r.event == "outcome" for r in records[last_lock + 1:])


def load_resume_action(claimed: bool, alive: bool, done: bool) -> Literal["start", "wait", "collect", "unknown"]:
    """What to do about a load from the target's markers alone."""
    if done:
        return "collect"
    if not claimed:
        return "start"
    return "wait" if alive else "unknown"

"""One measurement of one station, exactly as the executor would judge it, cached on disk.

A run is simulated, summarised (`core.metrics.summarize`, with the goal's per-request SLOs, as the loop's own runs
are: `GoalSpec.slos`, so a goodput objective has a figure) and judged (`executor.verdict.judge` with the executor's
own contract, `executor.collect.contract_for`); the goal's constraints then say whether it meets the SLO. Results
are cached under bench/.cache/ keyed by profile, scenario, knobs, seed and N (profile and scenario content included,
so an edited YAML never reads a stale figure).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from core import profiles, scenarios
from core import records as rec
from core.canonical import digest
from core.metrics import summarize
from core.station import full_knobs
from core.summary import Summary
from executor.collect import contract_for
from executor.verdict import judge
from simulator import engine

CACHE_VERSION = 1


class Eval(BaseModel):
    """The figures a tuner sees after one run: verdict, objective, SLO violations, load time, cards."""

    model_config = ConfigDict(frozen=True)
    verdict: str
    reasons: list[str] = []
    objective: float | None = None
    violations: list[str] = []
    load_s: float = 0.0
    cards: int = 1
    tpot_mean_ms: float | None = None
    whole: float | None = None
    native: float | None = None

    @property
    def valid(self) -> bool:
        return self.verdict == "valid"

    @property
    def feasible(self) -> bool:
        """Valid, meets every constraint, and has an objective figure (a missing native is not 0)."""
        return self.valid and not self.violations and self.objective is not None


def station_key(knobs: dict[str, Any]) -> str:
    """The cache key of a point: the planner's knobs digest (the same canonical form, so cached oracles stay valid)."""
    return digest(knobs, compact=False)


class Evaluator:
    """Measures stations of one (profile, scenario, goal) with a shared on-disk cache. `truth` (a profile name or YAML
    path) is the deployment measured where it is not the goal's `sim_profile` (bench --perturb-truth)."""

    def __init__(self, goal: Any, cache_dir: Path | None, truth: str | None = None):
        self.goal = goal
        self.profile = profiles.load(truth or goal.sim_profile)
        self.scenario = scenarios.load(goal.scenario)
        self.cache_dir = Path(cache_dir) if cache_dir else None
        ident = {"v": CACHE_VERSION, "profile": self.profile.model_dump(mode="json"),
                 "scenario": self.scenario.data_version, "objective": goal.objective.model_dump(),
                 "constraints": goal.constraints.model_dump()}
        if goal.objective.metric == "goodput":  # the SLOs change only a goodput figure: an Eval cached before they
            ident["slos"] = goal.slos()  # were passed (goodput None) is never read, every other cache stays valid
        self.ident = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:12]
        self.simulated = 0  # runs actually simulated (cache misses), for the report

    def full(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """The complete station the executor would deploy (catalog defaults filled in)."""
        return full_knobs(knobs, "sim")

    def path(self, knobs: dict[str, Any], seed: int, n: int) -> Path | None:
        if self.cache_dir is None:
            return None
        key = station_key({"knobs": self.full(knobs), "seed": seed, "n": n, "warmup": self.goal.protocol.warmup})
        return self.cache_dir / f"{self.profile.name}" / f"{self.scenario.name}-{self.ident}" / f"{key}.json"

    def __call__(self, knobs: dict[str, Any], seed: int, n: int) -> Eval:
        p = self.path(knobs, seed, n)
        if p is not None and p.exists():
            try:
                return Eval.model_validate_json(p.read_text())
            except ValueError:
                pass  # a torn or old file: measure again
        ev = self.measure(knobs, seed, n)
        if p is not None:
            p.parent.mkdir(parents=True, exist_ok=True)
            rec.write_atomic(p, ev.model_dump_json())
        return ev

    def measure(self, knobs: dict[str, Any], seed: int, n: int) -> Eval:
        self.simulated += 1
        run = engine.simulate(self.profile, self.scenario, self.full(knobs), n=n,
                              warmup=self.goal.protocol.warmup, seed=seed, observe=False)
        proto = self.goal.protocol
        summary = summarize(run.records, run.info, slos=self.goal.slos() or None,
                            native_min_requests=proto.native_min_requests,
                            native_min_seconds=proto.native_min_seconds)
        verdict = judge(run.records, run.info, contract_for(run.info))
        return of_summary(summary, verdict.kind, [r.code for r in verdict.reasons], self.goal)


def of_summary(summary: Summary | None, verdict: str, reasons: list[str], goal: Any) -> Eval:
    """An Eval from a summary and verdict (also used on the executor's own TrialResults)."""
    if summary is None:
        return Eval(verdict=verdict, reasons=reasons)
    load_s = summary.whole.end if summary.whole is not None else 0.0
    obj = goal.objective.value(summary)
    return Eval(verdict=verdict, reasons=reasons, objective=obj, violations=goal.constraints.violations(summary),
                load_s=load_s, cards=summary.cards, tpot_mean_ms=summary.tpot_ms.mean,
                whole=summary.whole.output_tok_s_per_card if summary.whole else None,
                native=summary.native.output_tok_s_per_card if summary.native else None)

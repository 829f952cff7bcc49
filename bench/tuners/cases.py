"""Benchmark cases read from a YAML file (bench/scenarios.yaml): a goal, a discrete search space and seeds.

A case is a goal (the same fields as a tuneloop goal file, minus the search space) plus `space` (the
discretised space every method searches, and the oracle enumerates) and `quick_space` for CI-sized
runs. Knobs outside the space stay at the goal's starting station for every method.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from state.errors import GoalError
from state.goal import GoalSpec, parse_goal


class CaseError(ValueError):
    """A benchmark case file is wrong; the message names the field and the reason."""


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    quick_seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    oracle_seed: int = 0
    target_gap: float = Field(0.02, gt=0, lt=1)
    baseline_trials: int = Field(60, ge=1)  # most runs random search and TPE may make
    quick_baseline_trials: int = Field(12, ge=1)
    # seeds of the baselines (measurement noise, and the sampler's seed for random / TPE; grid's server order too
    # where grid_order is seeded), apart from the loop's `seeds`: a baseline's median is over these
    baseline_seeds: list[int] = Field(default_factory=lambda: list(range(10)), min_length=1)
    quick_baseline_seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    # grid's server combinations: in the order the space lists them (vLLM auto_tune), or shuffled by the seed (so
    # where the optimum sits in a listed order cannot make grid lucky or unlucky)
    grid_order: Literal["listed", "seeded"] = "listed"


class Case(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    name: str
    description: str = ""
    goal: dict[str, Any]
    space: dict[str, list[Any]]
    quick_space: dict[str, list[Any]] | None = None
    # tune: the planner may be developed against it; heldout: reported apart, never tuned on (bench/README.md)
    set: Literal["tune", "heldout"] | None = None

    def space_for(self, quick: bool) -> dict[str, list[Any]]:
        return dict(self.quick_space if quick and self.quick_space else self.space)

    def goal_spec(self, quick: bool, seed: int) -> GoalSpec:
        """The tuneloop goal: the case's goal with the space in force and this seed's measurements."""
        data = dict(self.goal) | {"search_space": self.space_for(quick)}
        data["protocol"] = dict(data.get("protocol") or {}) | {"seeds": [seed]}
        data.setdefault("name", self.name)
        try:
            return parse_goal(data, f"case {self.name}")
        except GoalError as e:
            raise CaseError(f"cases.{self.name}.goal: {e}") from None


class CaseFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    settings: Settings = Settings()
    cases: list[Case] = Field(min_length=1)


def load_cases(path: str | Path) -> CaseFile:
    """Parse and check the file: every goal must validate, every space value must be a valid knob value."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise CaseError(f"{p}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise CaseError(f"{p}: not valid YAML: {e}") from None
    try:
        cf = CaseFile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "(file)"
        raise CaseError(f"{p}: {field}: {err['msg']}") from None
    names = [c.name for c in cf.cases]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise CaseError(f"{p}: cases.name: duplicate case name(s) {dup}")
    for c in cf.cases:
        for quick in (False, True):
            spec = c.goal_spec(quick, cf.settings.oracle_seed)
            if spec.engine != "sim" or spec.target != "sim" or not spec.sim_profile:
                raise CaseError(f"cases.{c.name}.goal: the benchmark needs engine sim, target sim and a sim_profile")
    return cf

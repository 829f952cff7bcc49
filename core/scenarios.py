"""Scenarios: versioned, seeded workload generators shared by the simulator and the load generator.

A scenario is data (YAML in core/scenarios/, a configured data directory, or a path the local user gives); the loop never changes it.
Prompts are whitespace-separated words; the simulator counts one token per word, a real engine
tokenises the same text its own way (the load generator records the engine's usage counts).
"""
from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from core import datafiles

Task = Literal["copy", "chat", "code"]


class Scenario(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    version: int = Field(ge=1)
    task: Task
    input_len: int = Field(ge=1)
    input_jitter: float = Field(0.0, ge=0.0, lt=1.0)  # uniform +- fraction of input_len
    output_len: int = Field(ge=1)
    prefix_share: float = Field(0.0, ge=0.0, lt=1.0)  # fraction of the input shared with earlier requests
    prefix_groups: int = Field(0, ge=0)
    min_request_hit: float | None = Field(None, ge=0.0, le=1.0)  # contract: each formal request's hit
    seed: int = 0
    model: dict[str, Any] | None = None  # real engines: recipe (+ pinned sha256) of a generated model (issue 7)

    @property
    def data_version(self) -> str:
        """Identity of the generated data: name, version, generator parameters (and the served model's)."""
        blob = self.model_dump_json(exclude={"model"} if self.model is None else None).encode()
        return f"{self.name}@v{self.version}:{hashlib.sha256(blob).hexdigest()[:12]}"

    @property
    def zero_cache(self) -> bool:
        return self.prefix_share == 0.0


class RequestSpec(BaseModel):
    model_config = ConfigDict(frozen=True)
    id: int
    n_in: int  # input tokens (words)
    n_out: int
    prefix_group: int | None  # requests in one group share the first prefix_len tokens
    prefix_len: int

    def prompt(self, scenario: Scenario) -> str:
        """The request's text: shared prefix words (per group) then words unique to the request."""
        words: list[str] = []
        if self.prefix_group is not None and self.prefix_len:
            words += _words(f"{scenario.name}/{scenario.version}/p{self.prefix_group}", self.prefix_len)
        words += _words(f"{scenario.name}/{scenario.version}/r{self.id}", self.n_in - len(words))
        return " ".join(words)


def _words(key: str, n: int) -> list[str]:
    rng = random.Random(key)
    return [f"w{rng.randrange(100000)}" for _ in range(n)]


def generate(scenario: Scenario, n: int, warmup: int = 0, seed: int | None = None) -> list[RequestSpec]:
    """Warm-up requests come first (ids < warmup) and prime every prefix group once."""
    rng = random.Random(scenario.seed if seed is None else seed)
    out: list[RequestSpec] = []
    for i in range(warmup + n):
        n_in = scenario.input_len
        if scenario.input_jitter:
            span = int(scenario.input_len * scenario.input_jitter)
            n_in = max(1, scenario.input_len + rng.randint(-span, span))
        group = None
        prefix_len = 0
        if scenario.prefix_groups and scenario.prefix_share:
            group = i % scenario.prefix_groups
            prefix_len = int(n_in * scenario.prefix_share)
        out.append(RequestSpec(id=i, n_in=n_in, n_out=scenario.output_len, prefix_group=group, prefix_len=prefix_len))
    return out


def builtin_dir() -> Path:
    return datafiles.builtin_dir("scenarios")


load = datafiles.loader("scenarios", "scenario", Scenario, cache_size=64)

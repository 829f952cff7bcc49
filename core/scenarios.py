"""Scenarios: versioned, seeded workload generators shared by the simulator and the load generator.

A scenario is data (YAML in core/scenarios/, a configured data directory, or a path the local user gives); the loop never changes it.
Prompts are whitespace-separated words; the simulator counts one token per word, a real engine
tokenises the same text its own way (the load generator records the engine's usage counts).

A scenario with a `source` (`Traffic`) is the user's own traffic: a prompt dataset or a trace with arrival times
(core/traffic.py reads it), in a file beside the scenario's YAML. Its requests and, for a trace, its arrivals
(`send_times`) are the same for the simulator and for a real engine's load generator.
"""
from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from core import datafiles, traffic
from core.arrivals import schedule

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


class Source(BaseModel):
    """Where a `Traffic` scenario's requests come from: a file beside its YAML, in one of core.traffic.FORMATS."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    file: str = Field(pattern=traffic.FILE_NAME)
    format: Literal["mooncake", "burstgpt", "sharegpt", "prompts-jsonl"]
    # trace: the file's own arrival times (divided by `speed`); rate: a trace stretched to the run's request rate,
    # a dataset sent by the run's arrival process. Default: trace where the format has times, else rate.
    timing: Literal["trace", "rate"] | None = None
    speed: float = Field(1.0, gt=0)
    sha256: str | None = None  # the file's digest: pinned here (a changed file is refused) or filled when read

    @model_validator(mode="after")
    def _timed(self) -> "Source":
        if self.timing == "trace" and self.format not in traffic.TIMED:
            raise ValueError(f"timing: trace needs arrival times, which format {self.format} has not "
                             f"(formats with times: {list(traffic.TIMED)})")
        return self

    @property
    def replays_times(self) -> bool:
        return (self.timing or ("trace" if self.format in traffic.TIMED else "rate")) == "trace"


class Traffic(Scenario):
    """The user's own traffic as a scenario: each request's lengths (and a dataset's text, a trace's arrival times and
    shared prefix blocks) come from `source`, read once by the loader (`load`). Nothing in it is generated but the
    words of a trace's prompts."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    task: Task = "chat"
    input_len: None = None  # each request's own
    output_len: None = None
    source: Source
    _rows: tuple[traffic.Row, ...] = PrivateAttr(default=())

    @model_validator(mode="before")
    @classmethod
    def _no_generator_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for k in ("input_len", "input_jitter", "output_len", "prefix_share", "prefix_groups", "min_request_hit"):
                if k in data:
                    raise ValueError(f"{k}: a scenario with a source takes its lengths and prefixes from the file")
        return data

    @property
    def zero_cache(self) -> bool:
        return False  # the user's prompts may share prefixes: no contract on cache hits

    @property
    def rows(self) -> tuple[traffic.Row, ...]:
        if not self._rows:
            raise ValueError(f"scenario {self.name!r}: its source file was never read (load it with scenarios.load)")
        return self._rows

    def read(self, yaml_path: Path, what: str) -> "Traffic":
        """This scenario with its source file read (beside `yaml_path`) and its digest in `source.sha256`."""
        shown = f"{what}: {self.source.file}"
        rows, digest = traffic.read(traffic.beside(yaml_path.parent, self.source.file, what), self.source.format,
                                    shown)
        if self.source.sha256 not in (None, digest):
            raise datafiles.DataFileError(f"{shown}: its sha256 is not the one the scenario pins (the file changed)")
        out = self.model_copy(update={"source": self.source.model_copy(update={"sha256": digest})})
        out._rows = rows
        return out


class RequestSpec(BaseModel):
    model_config = ConfigDict(frozen=True)
    id: int
    n_in: int  # input tokens (words)
    n_out: int
    prefix_group: int | None  # requests in one group share the first prefix_len tokens
    prefix_len: int
    text: str | None = None  # a dataset's prompt, sent as written
    blocks: tuple[int, ...] | None = None  # a trace's prefix blocks (core.traffic.MOONCAKE_BLOCK tokens per id)
    key: str | None = None  # what a trace request's own words are drawn from (its row and pass)

    def prompt(self, scenario: Scenario) -> str:
        """The request's text: shared prefix words (per group, or per trace block) then words unique to the
        request; a dataset's prompt as written."""
        if self.text is not None:
            return self.text
        words: list[str] = []
        if self.prefix_group is not None and self.prefix_len:
            words += _words(f"{scenario.name}/{scenario.version}/p{self.prefix_group}", self.prefix_len)
        for j, block in enumerate(self.blocks or ()):
            words += _words(f"{scenario.name}/{scenario.version}/b{block}",
                            min(traffic.MOONCAKE_BLOCK, self.n_in - j * traffic.MOONCAKE_BLOCK))
        words += _words(f"{scenario.name}/{scenario.version}/{self.key or f'r{self.id}'}", self.n_in - len(words))
        return " ".join(words)


def _words(key: str, n: int) -> list[str]:
    rng = random.Random(key)
    return [f"w{rng.randrange(100000)}" for _ in range(n)]


def generate(scenario: Scenario, n: int, warmup: int = 0, seed: int | None = None) -> list[RequestSpec]:
    """Warm-up requests come first (ids < warmup) and prime every prefix group once. A `Traffic` scenario's are its
    file's rows (core.traffic.picks)."""
    if isinstance(scenario, Traffic):
        rows = scenario.rows
        return [RequestSpec(id=i, n_in=rows[r].n_in, n_out=rows[r].n_out, prefix_group=None, prefix_len=0,
                            text=rows[r].text, blocks=rows[r].blocks, key=f"t{r}.{k}")
                for i, (r, k) in enumerate(traffic.picks(rows, n, warmup))]
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


def send_times(scenario: Scenario, n: int, rate: float, arrival: str = "constant", burstiness: float = 1.0,
               seed: int = 0, start: float = 0.0) -> list[float]:
    """When the n formal requests are sent: the run's arrival process (core.arrivals.schedule), or a trace's own
    times (`timing: rate`: stretched to the run's rate). The simulator and the load generator both ask here."""
    if isinstance(scenario, Traffic) and scenario.source.format in traffic.TIMED:
        src = scenario.source
        times = traffic.offsets(scenario.rows, n, src.speed, None if src.replays_times else rate)
        return [start + t for t in times]
    return schedule(n, rate, arrival, burstiness, seed, start)


class _File:
    """A scenario file: a `Traffic` where it names a source, else a generated `Scenario`."""

    @staticmethod
    def model_validate(data: Any) -> Scenario:
        return (Traffic if isinstance(data, dict) and "source" in data else Scenario).model_validate(data)


def _read_source(value: Scenario, path: Path, what: str) -> Scenario:
    return value.read(path, what) if isinstance(value, Traffic) else value


load = datafiles.loader("scenarios", "scenario", _File, cache_size=64, finish=_read_source)

"""The run-directory contract shared by the load generator, the simulator and the executor.

A run directory holds what one load run produced. Every writer appends and flushes as it goes,
so a crash loses no finished request; summarising is a separate step over these files.

    run.json              RunInfo: what was asked (scenario, N, C, r, cards, endpoint, seed)
    requests.jsonl        one RequestRecord per line, appended as each request finishes
    metrics.jsonl         one EngineSample per line (engine Prometheus scrape, ~1 per second)
    prefill_batches.jsonl one PrefillBatch per line (simulator only: tokens/requests per batch)
    breakdown.json        time per stage per role (the "profile" evidence)
    pid / rc / done       process id; exit code (written by atomic rename); done marker (last)
    summary.json          written by `tuneloop load summarize`, re-runnable

Times are seconds since the run's start on a monotonic clock (perf_counter_ns), or virtual
seconds in the simulator.
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Iterable, Iterator

from pydantic import BaseModel, ConfigDict

RUN_INFO = "run.json"
REQUESTS = "requests.jsonl"
METRICS = "metrics.jsonl"
PREFILL_BATCHES = "prefill_batches.jsonl"
BREAKDOWN = "breakdown.json"
PID, RC, DONE = "pid", "rc", "done"
SUMMARY = "summary.json"


class RunInfo(BaseModel):
    # request_rate may be inf: write it as the JSON constant Infinity (pydantic reads it back), not null
    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")
    scenario: str
    scenario_version: int
    n: int
    warmup: int = 0
    concurrency: int
    request_rate: float  # may be inf
    arrival: str = "constant"  # constant | poisson | gamma
    burstiness: float = 1.0
    cards: int = 1
    seed: int = 0
    endpoint: str | None = None
    output_len: int
    api: str = "completions"  # completions | chat


class RequestRecord(BaseModel):
    """One request as the client saw it. Absent facts are None, never 0."""

    model_config = ConfigDict(extra="allow")
    id: int
    warmup: bool = False
    t_sched: float  # when the arrival process meant to send
    t_send: float | None = None  # slot acquired, just before the POST; None = never sent
    chunk_times: list[float] = []  # arrival of each SSE event with non-empty content
    chunk_tokens: list[int] | None = None  # tokens per chunk when known (simulator); else None
    n_in: int | None = None  # usage.prompt_tokens
    n_cached: int | None = None  # usage.prompt_tokens_details.cached_tokens (absent -> None)
    n_out: int | None = None  # usage.completion_tokens
    n_out_expected: int
    finish_reason: str | None = None
    http_status: int | None = None
    ok: bool = False
    error: str | None = None

    @property
    def t_first(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def t_last(self) -> float | None:
        return self.chunk_times[-1] if self.chunk_times else None


class EngineSample(BaseModel):
    """One scrape of one engine instance: Prometheus names -> values (labels folded into the name)."""

    model_config = ConfigDict(extra="allow")
    t: float
    role: str  # prefill | decode | mixed
    instance: str
    values: dict[str, float]


class PrefillBatch(BaseModel):
    model_config = ConfigDict(extra="allow")
    t_start: float
    t_end: float
    instance: str
    n_reqs: int
    n_tokens: int
    chunks: list[int]  # tokens per request in this batch


class JsonlWriter:
    """Append-only JSONL writer that flushes every line, so a crash loses no finished record."""

    def __init__(self, path: Path):
        self._f = open(path, "a", encoding="utf-8")

    def write(self, model: BaseModel) -> None:
        self._f.write(model.model_dump_json() + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_jsonl(path: Path, model: type[BaseModel]) -> Iterator[BaseModel]:
    """Read records, skipping a torn last line left by a crash mid-write."""
    if not path.exists():
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # torn write at crash time
            line = line.strip()
            if line:
                yield model.model_validate_json(line)


def write_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """Write a file by rename so readers see the old or the new content, never a mix.

    The temporary name is unique per process and call, so concurrent writers (threads included) never
    share one.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_records(path: Path, models: Iterable[BaseModel]) -> None:
    with JsonlWriter(path) as w:
        for m in models:
            w.write(m)


def mark_done(run_dir: Path, rc: int) -> None:
    """rc first (atomic), then the done marker: a reader that sees done always sees rc."""
    write_atomic(run_dir / RC, f"{rc}\n")
    write_atomic(run_dir / DONE, json.dumps({"rc": rc}) + "\n")

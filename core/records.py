"""The run-directory contract shared by the load generator, the simulator and the executor.

A run directory holds what one load run produced. Every writer appends as it goes (unbuffered) and
fsyncs before the done marker, so a crash loses no finished request; summarising is a separate step over these files.

    run.json              RunInfo: what was asked (scenario, N, C, r, cards, endpoint, seed)
    requests.jsonl        one RequestRecord per line, appended as each request finishes
    metrics.jsonl         one EngineSample per line (engine Prometheus scrape, ~1 per second)
    prefill_batches.jsonl one PrefillBatch per line (simulator only: tokens/requests per batch)
    breakdown.json        time per stage per role (the "profile" evidence)
    expert_load.json      MoE: routed token-expert assignments per EP rank, per role and instance (optional)
    pid / rc / done       process id; exit code (written by atomic rename); done marker (last)
    summary.json          written by `tuneloop load summarize`, re-runnable

Times are seconds since the run's start on a monotonic clock (perf_counter_ns), or virtual
seconds in the simulator.
"""
from __future__ import annotations

import errno
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
EXPERT_LOAD = "expert_load.json"  # {role: {instance: {"per_rank_tokens": [...], ...}}}
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
    output_len: int | None  # None: each request's own (a scenario of the user's traffic: n_out_expected)
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
    # tokens each chunk's request already had computed when the step began (its prefix-cache hit plus its earlier
    # chunks: vLLM's num_computed_tokens per scheduled request), in the order of chunks; None where a log lacks them
    ctx: list[int] | None = None


class StorageFull(OSError):
    """The disk (or the quota) is full: a permanent error, never retried; nothing half-written stays behind."""

    def __str__(self) -> str:  # names itself wherever it is shown (a goal's stop reason, a run's status)
        return f"StorageFull ({errno.errorcode.get(self.errno or 0, self.errno)}): {self.strerror}"


def storage_error(e: OSError, path: Path) -> OSError:
    """ENOSPC / EDQUOT as StorageFull naming the file; any other OSError as it is."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT) and not isinstance(e, StorageFull):
        return StorageFull(e.errno, f"{os.strerror(e.errno)} writing {path}")
    return e


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in `path` durable (the directory entry itself)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JsonlWriter:
    """Append-only JSONL writer: every line goes to the file at once (unbuffered), so a crash loses no finished
    record; a line the disk cannot take is cut back off (no torn line), and close() fsyncs."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise storage_error(e, self.path) from e

    def write(self, model: BaseModel) -> None:
        data = (model.model_dump_json() + "\n").encode("utf-8")
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as e:
            os.ftruncate(self._fd, start)
            raise storage_error(e, self.path) from e

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            os.fsync(self._fd)
        except OSError as e:
            raise storage_error(e, self.path) from e
        finally:
            os.close(self._fd)
            self._fd = -1

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
    """Write a file by rename so readers see the old or the new content, never a mix: the data is fsynced
    before the rename and the directory after it; on any failure the temporary file is removed (ENOSPC /
    EDQUOT raise StorageFull).

    The temporary name is unique per process and call, so concurrent writers (threads included) never
    share one.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(e, OSError):
            raise storage_error(e, path) from e
        raise
    try:
        fsync_dir(path.parent)
    except OSError as e:
        raise storage_error(e, path) from e


def write_records(path: Path, models: Iterable[BaseModel]) -> None:
    with JsonlWriter(path) as w:
        for m in models:
            w.write(m)


def fsync_records(run_dir: Path) -> None:
    """Every JSONL record file of the run on disk (whoever wrote it)."""
    for p in sorted(Path(run_dir).glob("*.jsonl")):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def mark_done(run_dir: Path, rc: int) -> None:
    """The records on disk first, then rc (atomic), then the done marker: a reader that sees done always sees
    rc and every record."""
    fsync_records(run_dir)
    write_atomic(run_dir / RC, f"{rc}\n")
    write_atomic(run_dir / DONE, json.dumps({"rc": rc}) + "\n")


def default_runs_root() -> Path:
    """Where the executor keeps its run directories (and each goal its STATE.md): $TUNELOOP_RUNS_ROOT, else
    .tuneloop/runs. Read here once, for the executor and the state layer alike."""
    return Path(os.environ.get("TUNELOOP_RUNS_ROOT") or ".tuneloop/runs")

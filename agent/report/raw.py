"""Raw evidence a plot needs that the store only digests: engine queue samples and prefill batches, read
from a run's directory (`metrics.jsonl`, `prefill_batches.jsonl`). A run whose directory is not on this
machine (a remote target not yet fetched) gives None, and the report says so instead of drawing nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core import records as rec
from executor.evidence import RUNNING, WAITING, WAITING_DECODE, base_value


@dataclass(frozen=True)
class Queues:
    """Per scrape time: requests waiting on all prefill instances, waiting and running on all decode ones."""

    t: list[float]
    p_waiting: list[float]
    d_waiting: list[float]
    d_running: list[float]
    samples: dict[str, int]  # engine samples read per role


@dataclass(frozen=True)
class Batches:
    tokens: list[int]  # tokens per prefill batch
    reqs: list[int]  # requests per prefill batch


def queues(run_dir: str | Path | None) -> Queues | None:
    """Queue lengths over time, summed over the instances of each role per scrape round (a round closes
    when an instance reports again: real scrapers stamp each endpoint with its own time)."""
    if not run_dir or not (Path(run_dir) / rec.METRICS).exists():
        return None
    samples = sorted(rec.read_jsonl(Path(run_dir) / rec.METRICS, rec.EngineSample), key=lambda s: s.t)
    rounds: list[tuple[float, list[float]]] = []  # (time, [P waiting, D waiting, D running])
    seen: set[str] = set()
    counts: dict[str, int] = {}
    for s in samples:
        if not rounds or s.instance in seen:
            rounds.append((s.t, [0.0, 0.0, 0.0]))
            seen = set()
        seen.add(s.instance)
        row = rounds[-1][1]
        for role in ("prefill", "decode"):
            if s.role != role and s.role != "mixed":
                continue
            counts[role] = counts.get(role, 0) + 1
            w = base_value(s.values, WAITING if role == "prefill" else WAITING_DECODE) or 0.0
            if role == "prefill":
                row[0] += w
            else:
                row[1] += w
                row[2] += base_value(s.values, RUNNING) or 0.0
    return Queues(t=[t for t, _ in rounds], p_waiting=[r[0] for _, r in rounds], d_waiting=[r[1] for _, r in rounds],
                  d_running=[r[2] for _, r in rounds], samples=counts)


def batches(run_dir: str | Path | None) -> Batches | None:
    if not run_dir or not (Path(run_dir) / rec.PREFILL_BATCHES).exists():
        return None
    bs = list(rec.read_jsonl(Path(run_dir) / rec.PREFILL_BATCHES, rec.PrefillBatch))
    return Batches(tokens=[b.n_tokens for b in bs], reqs=[b.n_reqs for b in bs])

"""The engine's own iteration statistics as residuals of the calibration (simulator.calibrate).

A run directory's metrics.jsonl holds the scraped samples of every engine instance over the load (the executor's
scraper, about once a second; the simulator's own, each virtual second). Between two consecutive scrapes of one
busy decode (or mixed) instance, vLLM's `vllm:iteration_tokens_total` histogram says how many engine steps ran
(Δcount) and how many tokens they carried (Δsum). The step-time shapes are linear in the batch, so the interval's
length is predicted exactly by its mean batch: Δt = Δcount · t_D(B̄, KV̄) (+ b_P·Δprompt + c_P·Δprompt·n̄/2 on a
mixed instance, whose steps carry the prompt tokens too), with B̄ = decode tokens / Δcount / tokens per request
step (1 + accepted drafts, from the request records) and KV̄ = B̄ × the mean context of the requests in decode at
the interval's midpoint (the request records). The batch moves between intervals (ramp-up, finishes, arrivals,
max_num_seqs), which identifies the decode coefficients from the engine's series alone.

An interval counts when the instance was running requests at both scrapes and ran at least MIN_STEPS steps (an
idle gap inside it is then unlikely); engines without the histogram (llama.cpp, SGLang) give no rows.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from core.records import EngineSample, RequestRecord

ITER = "vllm:iteration_tokens_total"
RUNNING = "vllm:num_requests_running"
PROMPT = "vllm:prompt_tokens_total"
HITS = "vllm:prefix_cache_hits_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
MIN_STEPS = 3
COLUMNS = ("dt", "steps", "B", "KV", "prompt", "n_in_mean")


def total(values: dict[str, float], name: str) -> float | None:
    """Sum over every label series of one metric (one per DP engine, say); None when absent."""
    hits = [v for k, v in values.items() if k == name or k.startswith(name + "{")]
    return float(sum(hits)) if hits else None


def _context(records: list[RequestRecord]) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    starts = np.array([r.chunk_times[0] for r in records])
    ends = np.array([r.chunk_times[-1] for r in records])
    cum = []
    for r in records:
        toks = r.chunk_tokens or [1] * len(r.chunk_times)
        cum.append((np.array(r.chunk_times), np.concatenate([[0], np.cumsum(toks[1:])]).astype(float)))
    return starts, ends, cum


def tokens_per_step(samples: list[EngineSample], records: list[RequestRecord], k: int) -> float:
    """Tokens a request gets per decode step: 1 without speculation; else 1 + accepted / drafts from the engine's
    counters over the load (vLLM counts a draft per request and step), else from the records' chunks (one chunk
    a step: the records must be streamed)."""
    if not k:
        return 1.0
    first: dict[str, tuple[float, float]] = {}
    last: dict[str, tuple[float, float]] = {}
    for s in sorted(samples, key=lambda s: s.t):
        d, a = total(s.values, DRAFTS), total(s.values, ACCEPTED)
        if d is not None and a is not None:
            first.setdefault(s.instance, (d, a))
            last[s.instance] = (d, a)
    drafts = sum(last[i][0] - first[i][0] for i in last)
    if drafts > 0:
        return 1.0 + sum(last[i][1] - first[i][1] for i in last) / drafts
    toks = sum(sum((r.chunk_tokens or [1] * len(r.chunk_times))[1:]) for r in records)
    steps = sum(len(r.chunk_times) - 1 for r in records)
    return toks / steps if steps else 1.0


def series_rows(samples: list[EngineSample], records: list[RequestRecord], k: int = 0) -> np.ndarray:
    """One row per usable scrape interval of a decode / mixed instance: COLUMNS."""
    by_inst: dict[str, list[EngineSample]] = defaultdict(list)
    for s in samples:
        if s.role in ("decode", "mixed") and total(s.values, f"{ITER}_count") is not None:
            by_inst[s.instance].append(s)
    if not by_inst or not records:
        return np.zeros((0, len(COLUMNS)))
    al = tokens_per_step(samples, records, k)
    starts, ends, cum = _context(records)
    n_in = np.array([r.n_in or 0 for r in records], dtype=float)
    n_in_mean = float(n_in.mean())
    rows: list[tuple[float, ...]] = []
    for inst, ss in by_inst.items():
        ss.sort(key=lambda s: s.t)
        for s0, s1 in zip(ss, ss[1:]):
            v0, v1 = s0.values, s1.values
            steps = total(v1, f"{ITER}_count") - total(v0, f"{ITER}_count")
            dt = s1.t - s0.t
            if steps < MIN_STEPS or dt <= 0 or not (total(v0, RUNNING) or 0) > 0 or not (total(v1, RUNNING) or 0) > 0:
                continue
            toks = total(v1, f"{ITER}_sum") - total(v0, f"{ITER}_sum")
            prompt = 0.0
            if s0.role == "mixed":
                prompt = max(0.0, _delta(v0, v1, PROMPT) - _delta(v0, v1, HITS))
            b = max(0.0, toks - prompt) / steps / al
            mid = 0.5 * (s0.t + s1.t)
            live = np.flatnonzero((starts <= mid) & (ends > mid))
            if not len(live):
                continue
            ctx = np.mean([n_in[i] + _emitted(cum[i], mid) for i in live])
            rows.append((dt, steps, b, b * ctx, prompt, n_in_mean))
    return np.array(rows, dtype=float).reshape(-1, len(COLUMNS))


def _delta(v0: dict[str, float], v1: dict[str, float], name: str) -> float:
    a, b = total(v0, name), total(v1, name)
    return (b - a) if a is not None and b is not None else 0.0


def _emitted(c: tuple[np.ndarray, np.ndarray], t: float) -> float:
    """Tokens the request generated after its first by time t (linear inside a chunk of several steps)."""
    times, csum = c
    return float(np.interp(t, times, csum))


def summary(rows: np.ndarray, res: np.ndarray) -> dict[str, Any]:
    """rms / mean of the relative residuals, intervals, and the batch range the series spans."""
    return {"rms": float(np.sqrt(np.mean(res ** 2))), "mean": float(np.mean(res)), "steps": int(len(res)),
            "batch_min": float(rows[:, 2].min()), "batch_max": float(rows[:, 2].max()),
            "batch_mean": float(np.average(rows[:, 2], weights=rows[:, 1]))}

"""Exports: a `vllm bench serve`-compatible result JSON and a per-request CSV, from raw records.

vLLM's result file reports whole-run figures (seconds for per-request lists, ms for statistics);
tuneloop adds the native window under `tuneloop_native` so nothing is lost. Every key `vllm bench serve
--save-result --save-detailed` (vllm 0.32, vllm/benchmarks/serve.py) writes for a text run is written, in its units:
per-request lists in seconds (`start_times` from the load's start, where vLLM's are perf_counter readings: only
differences mean anything in either), `failed` requests with output length 0 and latency 0, the client queue
(`queue_times` = sent - arrival, while waiting for a slot of C) and its `client_queue_time` statistics (with a C;
`e2el_including_client_queue` only at a finite rate, as vLLM), and vLLM's 1-s bucket peaks
`max_output_tokens_per_s` / `max_concurrent_requests`. With the engine's metric samples of the run (the load's
`--metrics-url` scrapes) and vLLM's spec-decode counters in them, the six `spec_decode_*` keys vLLM's client adds
for a drafting server are written too, from the same counter deltas. bench/engine_crosscheck.py compares the key
sets.
"""
from __future__ import annotations

import csv
import io
import math
from datetime import datetime
from typing import Sequence

import numpy as np

from core.metrics import e2e_ms, n_out_of, summarize, tpot_ms, ttft_ms
from core.records import EngineSample, RequestRecord, RunInfo
from core.evidence_decode import spec_decode_stats

CSV_FIELDS = ["id", "warmup", "ok", "http_status", "finish_reason", "error", "t_sched", "t_send", "t_first",
              "t_last", "n_in", "n_cached", "n_out", "n_out_expected", "n_chunks", "ttft_ms", "tpot_ms",
              "e2e_ms", "queue_delay_ms"]


def _stats(name: str, vals: list[float], unit: str = "ms") -> dict[str, float]:
    a = np.asarray(vals or [0.0], dtype=float)
    out = {f"mean_{name}_{unit}": float(a.mean()), f"median_{name}_{unit}": float(np.median(a)),
           f"std_{name}_{unit}": float(a.std())}
    for p in (50, 90, 99):
        out[f"p{p}_{name}_{unit}"] = float(np.percentile(a, p))
    return out


def _peaks(ok: Sequence[RequestRecord]) -> tuple[float, int]:
    """vLLM's max_output_tokens_per_s and max_concurrent_requests: tokens (one per content chunk, as its client
    counts them) and active requests per 1-s bucket from the first send, over successful requests."""
    if not ok:
        return 0.0, 0
    end = {r.id: r.chunk_times[-1] if r.chunk_times else r.t_end for r in ok}  # vLLM: start + latency
    t0 = min(r.t_send for r in ok)
    buckets = int(np.ceil(max(end.values()) - t0)) + 1
    tokens, active = np.zeros(buckets), np.zeros(buckets)
    for r in ok:
        for t in r.chunk_times:
            if 0 <= int(t - t0) < buckets:
                tokens[int(t - t0)] += 1
        active[int(r.t_send - t0):int(end[r.id] - t0) + 1] += 1
    return float(tokens.max()), int(active.max())


def vllm_result(records: Sequence[RequestRecord], info: RunInfo, model_id: str = "tuneloop-sim",
                slos: dict[str, float] | None = None, samples: Sequence[EngineSample] = ()) -> dict:
    """The dict `vllm bench serve --save-result` writes, filled from our records (and the run's engine samples)."""
    s = summarize(records, info, slos=slos)
    formal = sorted((r for r in records if not r.warmup), key=lambda r: r.id)
    ok = [r for r in formal if r.ok]
    dur = s.whole.duration if s.whole else 0.0
    n_in = sum(r.n_in or 0 for r in ok)
    n_out = sum(n_out_of(r) or 0 for r in ok)
    itls = [[(b - a) for a, b in zip(r.chunk_times, r.chunk_times[1:])] for r in formal]
    res = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "openai" if info.api == "completions"
        else "openai-chat", "model_id": model_id, "tokenizer_id": model_id, "num_prompts": info.n,
        "request_rate": "inf" if math.isinf(info.request_rate) else info.request_rate,
        "burstiness": info.burstiness, "max_concurrency": info.concurrency,
        "duration": dur, "completed": len(ok), "total_input_tokens": n_in, "total_output_tokens": n_out,
        "request_throughput": len(ok) / dur if dur else 0.0,
        "request_goodput": s.whole.goodput if s.whole and s.whole.goodput is not None else None,
        "output_throughput": n_out / dur if dur else 0.0,
        "total_token_throughput": (n_in + n_out) / dur if dur else 0.0,
        "input_lens": [r.n_in or 0 for r in formal], "output_lens": [n_out_of(r) or 0 for r in formal],
        "ttfts": [(ttft_ms(r) or 0.0) / 1e3 for r in formal], "itls": itls,
        "generated_texts": ["" for _ in formal], "errors": [r.error or "" for r in formal],
        "endpoint_type": "openai" if info.api == "completions" else "openai-chat", "label": None,
        "failed": len(formal) - len(ok),
        "latencies": [(e2e_ms(r) or 0.0) / 1e3 if r.ok else 0.0 for r in formal],
        "start_times": [r.t_send or 0.0 for r in formal],
        "queue_times": [(r.t_send - r.t_sched) if r.t_send is not None else 0.0 for r in formal],
        "rtfx": 0.0,  # inverse real-time factor of audio input: none in a text run
    }
    res["max_output_tokens_per_s"], res["max_concurrent_requests"] = _peaks(ok)
    for name, fn in (("ttft", ttft_ms), ("tpot", tpot_ms), ("e2el", e2e_ms)):
        res.update(_stats(name, [v for r in ok if (v := fn(r)) is not None]))
    res.update(_stats("itl", [x * 1e3 for r, gaps in zip(formal, itls) if r.ok for x in gaps]))
    queue_ms = [(r.t_send - r.t_sched) * 1e3 for r in ok if r.t_send is not None]
    if info.concurrency:
        res.update(_stats("client_queue_time", queue_ms))
        if not math.isinf(info.request_rate):
            res.update(_stats("e2el_including_client_queue",
                              [q + (e2e_ms(r) or 0.0) for r, q in zip((r for r in ok if r.t_send is not None), queue_ms)]))
    res.update(spec_decode_stats(samples) or {})
    res["tuneloop_native"] = s.native.model_dump() if s.native else None
    res["tuneloop_native_reason"] = s.native_reason
    res["tuneloop_definitions"] = s.definitions
    return res


def requests_csv(records: Sequence[RequestRecord]) -> str:
    """One row per request (warm-up included, flagged), latencies in ms."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS)
    w.writeheader()
    for r in sorted(records, key=lambda r: r.id):
        row = {k: getattr(r, k, None) for k in CSV_FIELDS if hasattr(r, k)}
        row.update(t_first=r.t_first, t_last=r.t_last, n_chunks=len(r.chunk_times), ttft_ms=ttft_ms(r),
                   tpot_ms=tpot_ms(r), e2e_ms=e2e_ms(r),
                   queue_delay_ms=(r.t_send - r.t_sched) * 1e3 if r.t_send is not None else None)
        w.writerow({k: ("" if row.get(k) is None else row[k]) for k in CSV_FIELDS})
    return buf.getvalue()

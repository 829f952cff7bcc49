"""Exports: a `vllm bench serve`-compatible result JSON and a per-request CSV, from raw records.

vLLM's result file reports whole-run figures (seconds for per-request lists, ms for statistics);
tuneloop adds the native window under `tuneloop_native` so nothing is lost.
"""
from __future__ import annotations

import csv
import io
import math
from datetime import datetime
from typing import Sequence

import numpy as np

from core.metrics import e2e_ms, n_out_of, summarize, tpot_ms, ttft_ms
from core.records import RequestRecord, RunInfo

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


def vllm_result(records: Sequence[RequestRecord], info: RunInfo, model_id: str = "tuneloop-sim",
                slos: dict[str, float] | None = None) -> dict:
    """The dict `vllm bench serve --save-result` writes, filled from our records."""
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
    }
    for name, fn in (("ttft", ttft_ms), ("tpot", tpot_ms), ("e2el", e2e_ms)):
        res.update(_stats(name, [v for r in ok if (v := fn(r)) is not None]))
    res.update(_stats("itl", [x * 1e3 for r, gaps in zip(formal, itls) if r.ok for x in gaps]))
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

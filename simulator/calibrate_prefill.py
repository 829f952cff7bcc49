"""Prefill step observations for the calibration (simulator.calibrate): the engine's per-step batch records where a
run has them, else the TTFT of requests that found the prefill idle (prefilled alone: ceil(U / budget) steps over
their U uncached tokens).

A chunk's attention term is n * (ctx + n / 2) over the tokens ctx its request already has in KV. A batch record
that carries each chunk's ctx (its prefix-cache hit plus its earlier chunks) is read as it is; one without reads
every chunk at the run's mean prefix hit, but a batch's first after a full batch on its instance (the same request's
next chunk) just past that one's last: right on average, wrong per chunk where hits differ per request (shared
preambles that some requests find and others miss)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def prefill_steps(run: Any) -> tuple[list[tuple[float, list[tuple[int, float]]]], str]:
    """(dt, [(tokens, attention term) per DP rank]) per prefill step, and where they came from."""
    cached = [r.n_cached or 0 for r in run.records]
    ctx0 = float(np.mean(cached)) if cached else 0.0
    budget = int(run.knobs["max_num_batched_tokens"])
    cap = run.knobs.get("max_prefill_reqs")
    if run.batches:
        steps: dict[tuple[str, float], tuple[float, list[tuple[int, float]]]] = {}
        carry: dict[str, float | None] = {}
        for b in sorted(run.batches, key=lambda x: (x.t_start, x.instance)):
            ctxs = b.ctx if b.ctx is not None and len(b.ctx) == len(b.chunks) else \
                [carry.get(b.instance) if i == 0 and carry.get(b.instance) is not None else ctx0
                 for i in range(len(b.chunks))]
            attn = sum(n * (c + n / 2) for n, c in zip(b.chunks, ctxs))
            full = sum(b.chunks) >= budget and not (cap is not None and len(b.chunks) >= cap and sum(b.chunks) < budget)
            carry[b.instance] = ctxs[-1] + b.chunks[-1] if full else None
            key = (b.instance.split(".dp")[0], b.t_start)
            dt, ranks = steps.get(key, (b.t_end - b.t_start, []))
            steps[key] = (dt, ranks + [(sum(b.chunks), attn)])
        return [v for v in steps.values() if v[0] > 0], "per-step batch records"
    out = []
    spans = sorted((r.t_send, r.chunk_times[0]) for r in run.records if r.t_send is not None)
    for r in run.records:
        if r.t_send is None or r.n_in is None:
            continue
        others = sum(1 for s, f in spans if s < r.chunk_times[0] and f > r.t_send) - 1
        if others > 0:
            continue  # queued behind or beside another prefill: not a clean observation
        u = r.n_in - (r.n_cached or 0)
        n_steps = max(1, math.ceil(u / budget))
        out.append((r.chunk_times[0] - r.t_send, [(u, (r.n_cached or 0) * u + u * u / 2, n_steps)]))
    return out, "TTFT of requests that found the prefill idle"

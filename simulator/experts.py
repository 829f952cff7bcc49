"""Expert routing skew per EP rank, and the expert-load record a simulated run leaves behind.

A layout places experts on EP ranks; routing is skewed (some experts are hot), so some ranks get more of a
step's token-expert assignments than others. The profile gives each layout's persistent skew as the max/mean
rank load (`decode_cost.if_static[layout]`: a static EPLB map fitted to collected statistics flattens it, the
default placement does not). The shares fall off exponentially from the hottest rank, scaled so max/mean is
exactly that skew; which rank is hottest depends on the placement (a seeded permutation).

The record has the shape of what SGLang's expert-distribution recorder (`/dump_expert_distribution_record`,
per-rank token counts) and vLLM's EPLB load window (`expert_load_pass` summed per physical rank; its log line
reports balancedness = mean/max) give: routed token-expert assignments per EP rank, per instance
(core.records.EXPERT_LOAD in the run directory).
"""
from __future__ import annotations

import numpy as np


def rank_shares(ep: int, max_over_mean: float, seed: int = 0) -> np.ndarray:
    """Shares of routed tokens per rank (sum 1) with max/mean == max_over_mean (clipped to [1, ep))."""
    if ep <= 1:
        return np.ones(1)
    m = min(max(1.0, float(max_over_mean)), ep * 0.999)
    x = np.arange(ep) / (ep - 1)
    if m - 1.0 < 1e-12:
        shares = np.full(ep, 1.0 / ep)
    else:
        lo, hi = 0.0, 1.0
        while ep / np.exp(-hi * x).sum() < m:  # max/mean of exp(-βx) grows with β
            lo, hi = hi, hi * 2
        for _ in range(80):
            mid = (lo + hi) / 2
            if ep / np.exp(-mid * x).sum() < m:
                lo = mid
            else:
                hi = mid
        w = np.exp(-hi * x)
        shares = w / w.sum()
    return shares[np.random.default_rng([seed, ep]).permutation(ep)]


def record(decode_instances) -> dict:
    """The run's expert-load record: per MoE decode instance, routed assignments per EP rank."""
    out: dict[str, dict] = {}
    for d in decode_instances:
        if d.cost.ep <= 1:
            continue
        load = d.expert_load()
        mean = sum(load) / len(load)
        out.setdefault("decode", {})[d.name] = {
            "layout": d.layout, "ep": d.cost.ep, "topk": d.cost.topk, "per_rank_tokens": load,
            "balancedness": mean / max(load) if mean > 0 else None}
    return out

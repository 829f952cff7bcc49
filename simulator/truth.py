"""The simulator's own ground truth, computed from its emission, to check the metrics code against."""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any, Sequence

from core.records import RequestRecord


def _inflight_bounds(formal: Sequence[RequestRecord], c: int) -> tuple[float, float] | None:
    """a = send of the 2nd request that brings in-flight to C; b = last time in-flight == C."""
    ev = [(r.t_send, 1) for r in formal] + [(r.chunk_times[-1], -1) for r in formal]
    ev.sort()  # by time, completions (-1) before sends (+1) at the same instant: the tuples' own order
    n, hits, a, b, at_c = 0, 0, None, None, False
    for t, d in ev:
        if at_c and d < 0:
            b = t
        n += d
        at_c = n == c
        if at_c and d > 0:
            hits += 1
            if hits == 2:
                a = t
    if a is None or b is None or b <= a:
        return None
    return a, b


def _tokens_in(formal: Sequence[RequestRecord], a: float, b: float) -> float:
    """Tokens whose chunk arrived in [a, b]. A record's chunk times are in arrival order, so the window is one slice
    of them, found by bisection (why: the chunk-by-chunk scan was a tenth of a batch run's wall time)."""
    tot = 0
    for r in formal:
        times = r.chunk_times
        if times[-1] < a or times[0] > b:
            continue
        lo, hi = bisect_left(times, a), bisect_right(times, b)
        tot += sum(r.chunk_tokens[lo:hi]) if r.chunk_tokens else hi - lo
    return float(tot)


def compute(records: Sequence[RequestRecord], concurrency: int, cards: int,
            min_requests: int = 128, min_seconds: float = 60.0) -> dict[str, Any]:
    formal = [r for r in records if not r.warmup and r.ok and r.chunk_times and r.t_send is not None]
    out: dict[str, Any] = {"n_formal_done": len(formal), "cards": cards}
    if not formal:
        return out
    t0 = min(r.t_send for r in formal)
    t1 = max(r.chunk_times[-1] for r in formal)
    dur = t1 - t0
    toks = sum(r.n_out or 0 for r in formal)
    e2e = [r.chunk_times[-1] - r.t_send for r in formal]
    ttft = [r.chunk_times[0] - r.t_send for r in formal]
    tpot = [(r.chunk_times[-1] - r.chunk_times[0]) / (r.n_out - 1) for r in formal if (r.n_out or 0) > 1]
    out.update({
        "whole_s": dur,
        "whole_tok_s": toks / dur,
        "whole_tok_s_per_card": toks / dur / cards,
        "achieved_concurrency": sum(e2e) / dur,
        "qps": len(formal) / dur,
        "mean_e2e_s": sum(e2e) / len(e2e),
        "mean_ttft_ms": 1000 * sum(ttft) / len(ttft),
        "mean_tpot_ms": 1000 * sum(tpot) / len(tpot) if tpot else None,
        "native": None,
        "native_reason": None,
    })
    bounds = _inflight_bounds(formal, concurrency)
    if bounds is None:
        out["native_reason"] = f"in-flight never returned to C={concurrency}"
        return out
    a, b = bounds
    started = [r for r in formal if a <= r.t_send <= b]
    max_e2e = max((r.chunk_times[-1] - r.t_send for r in started), default=0.0)
    tok = _tokens_in(formal, a, b)
    native = {"start": a, "end": b, "duration": b - a, "n_requests": len(started),
              "tok_s": tok / (b - a), "tok_s_per_card": tok / (b - a) / cards, "max_e2e_s": max_e2e}
    out["native_candidate"] = native
    if len(started) < min_requests:
        out["native_reason"] = f"{len(started)} requests started in the window (< {min_requests})"
    elif b - a < min_seconds:
        out["native_reason"] = f"window {b - a:.2f} s (< {min_seconds:g} s)"
    elif max_e2e >= (b - a) / 3:
        out["native_reason"] = f"max E2E {max_e2e:.2f} s >= window/3 ({(b - a) / 3:.2f} s)"
    else:
        out["native"] = native
    return out

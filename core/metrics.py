"""Benchmark figures from raw request records, exactly as docs/metrics.md defines them.

Pure functions: the same records always give the same Summary, so summarising is re-runnable over
a raw file. Whole window = first formal send to last formal completion; native window = the
steady state in which in-flight == C (AISBench stable_stage). A native window below the minimum
has no figure (None plus a reason), never 0.
"""
from __future__ import annotations

import math
from itertools import chain
from typing import Iterable, Sequence

import numpy as np

from core.errors import FieldError
from core.records import RequestRecord, RunInfo
from core.summary import Dist, Summary, WindowFigures

SLO_KEYS = {"ttft_ms": "ttft", "ttft": "ttft", "tpot_ms": "tpot", "tpot": "tpot",
            "e2e_ms": "e2e", "e2el": "e2e", "e2e": "e2e", "e2el_ms": "e2e"}

DEFINITIONS = {
    "clock": "time.perf_counter_ns() (monotonic) at the client, or virtual seconds in the simulator",
    "ttft": "t_1 - t_send: first SSE event with non-empty content minus the moment the slot was acquired",
    "e2e": "t_last - t_send: last content event (not [DONE], not the usage-only chunk) minus t_send",
    "tpot": "(E2E - TTFT) / (n_out - 1), only for n_out > 1 (vLLM / AISBench meaning)",
    "itl": "gaps t_k - t_(k-1), k >= 2, per content chunk (a chunk may carry several tokens)",
    "queue_delay": "t_send - t_sched: client queue delay (coordinated omission shows up here)",
    "n_out": "usage.completion_tokens; n_in = usage.prompt_tokens; n_cached = prompt_tokens_details.cached_tokens",
    "whole_window": "from the first formal t_send to the last formal completion",
    "native_window": "a = send time of the 2nd request that brings in-flight to C; b = last time in-flight == C; "
                     "valid only with >= {min_n} requests started in [a, b], b - a >= {min_s} s, max E2E < (b - a)/3",
    "output_tok_s": "output tokens whose chunk timestamps fall in the window / window length",
    "per_card": "divided by the number of cards in use (P + D)",
    "achieved_concurrency": "time-average of in-flight requests over the window",
    "qps": "requests completed successfully inside the window / window length",
    "goodput": "requests completed inside the window meeting every SLO / window length",
    "cache_hit": "sum n_cached / sum n_in over formal requests; min over requests also reported",
    "prompt_uncached_mean": "mean of n_in - n_cached over formal requests with n_in (n_cached 0 when absent): the "
                            "prompt tokens a prefill pass must compute per request",
    "n_requests": "formal requests whose t_send falls inside the window",
    "percentiles": "linear interpolation between closest ranks (numpy default), as vllm bench serve",
}


def dist(values: Sequence[float]) -> Dist:
    """Mean and P50/P90/P99 (linear interpolation, as numpy and vllm bench serve)."""
    if len(values) == 0:
        return Dist(n=0)
    a = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return Dist(n=len(a), mean=float(a.mean()), p50=float(p50), p90=float(p90), p99=float(p99))


def end_time(r: RequestRecord) -> float | None:
    """When a request left the in-flight set: last content event, else the recorded end, else its send."""
    if r.chunk_times:
        return r.chunk_times[-1]
    t_end = getattr(r, "t_end", None)
    return t_end if t_end is not None else r.t_send


def n_out_of(r: RequestRecord) -> float | None:
    if r.n_out is not None:
        return r.n_out
    if r.chunk_tokens is not None:
        return sum(r.chunk_tokens)
    return None


def ttft_ms(r: RequestRecord) -> float | None:
    return None if r.t_send is None or not r.chunk_times else (r.chunk_times[0] - r.t_send) * 1e3


def e2e_ms(r: RequestRecord) -> float | None:
    return None if r.t_send is None or not r.chunk_times else (r.chunk_times[-1] - r.t_send) * 1e3


def tpot_ms(r: RequestRecord) -> float | None:
    n = n_out_of(r)
    e2e, ttft = e2e_ms(r), ttft_ms(r)
    if n is None or n <= 1 or e2e is None or ttft is None:
        return None
    return (e2e - ttft) / (n - 1)


def chunk_token_counts(r: RequestRecord) -> list[float]:
    """Tokens carried by each chunk: chunk_tokens when known, else n_out spread evenly over the chunks."""
    k = len(r.chunk_times)
    if k == 0:
        return []
    if r.chunk_tokens is not None and len(r.chunk_tokens) == k:
        return [float(x) for x in r.chunk_tokens]
    n = n_out_of(r)
    per = (n / k) if n is not None else 1.0
    return [per] * k


def gaps_ms(records: Sequence[RequestRecord]) -> np.ndarray:
    """Every record's chunk gaps (t_k - t_(k-1)) * 1e3, record after record: the ITL samples. One array operation
    over all chunk times, less the gaps between one record's last chunk and the next one's first (why: a gap at a
    time in Python was a fifth of summarising a simulated run); the same floats in the same order."""
    times = [r.chunk_times for r in records if r.chunk_times]
    flat = np.fromiter(chain.from_iterable(times), dtype=float, count=sum(map(len, times)))
    starts = np.cumsum([len(t) for t in times], dtype=np.int64)[:-1]  # where each record after the first begins
    return np.delete((flat[1:] - flat[:-1]) * 1e3, starts - 1)


def tokens_in(records: Iterable[RequestRecord], a: float, b: float) -> float:
    total = 0.0
    for r in records:
        ts = r.chunk_times
        if not ts or ts[-1] < a or ts[0] > b:
            continue
        if r.chunk_tokens is not None and len(r.chunk_tokens) == len(ts):
            # whole counts, summed as integers: exactly the float sum of them, without a float per chunk
            if a <= ts[0] and ts[-1] <= b:
                total += sum(r.chunk_tokens)
            else:
                times = np.asarray(ts)
                total += int(np.asarray(r.chunk_tokens)[(a <= times) & (times <= b)].sum())
            continue
        counts = chunk_token_counts(r)
        if a <= ts[0] and ts[-1] <= b:
            total += sum(counts)
        else:
            total += sum(c for t, c in zip(ts, counts) if a <= t <= b)
    return total


def inflight_steps(records: Sequence[RequestRecord]) -> list[tuple[float, int, int]]:
    """(time, delta, record index) events; at equal times completions come before sends."""
    ev: list[tuple[float, int, int]] = []
    for i, r in enumerate(records):
        if r.t_send is None:
            continue
        ev.append((r.t_send, +1, i))
        ev.append((end_time(r), -1, i))
    ev.sort(key=lambda e: (e[0], e[1]))
    return ev


def time_avg_inflight(ev: list[tuple[float, int, int]], a: float, b: float) -> float:
    if b <= a:
        return 0.0
    area, n, prev = 0.0, 0, a
    for t, d, _ in ev:
        if t > b:
            break
        if t > a:
            area += n * (t - max(prev, a))
            prev = t
        n += d
    area += n * (b - max(prev, a))
    return area / (b - a)


def native_bounds(ev: list[tuple[float, int, int]], c: int) -> tuple[float, float] | None:
    """[a, b]: a = the 2nd send that brings in-flight to C; b = the last moment in-flight was C."""
    n, hits, a, b = 0, 0, None, None
    for t, d, _ in ev:
        n += d
        if d > 0 and n == c:
            hits += 1
            if hits == 2:
                a = t
        if d < 0 and n == c - 1:
            b = t
    if a is None or b is None or b <= a:
        return None
    return a, b


def meets(r: RequestRecord, slos: dict[str, float]) -> bool:
    """Every SLO met; each figure computed when its SLO is read (they are pure functions of the record)."""
    for k, limit in slos.items():
        v = _SLO_FIGURE[SLO_KEYS[k]](r)
        if v is None and SLO_KEYS[k] == "tpot" and r.ok:
            continue  # a one-token output has no TPOT: nothing to miss
        if v is None or v > limit:
            return False
    return True


_SLO_FIGURE = {"ttft": ttft_ms, "tpot": tpot_ms, "e2e": e2e_ms}


def window(kind: str, formal: Sequence[RequestRecord], ev, a: float, b: float, cards: int,
           slos: dict[str, float] | None) -> WindowFigures:
    dur = b - a
    ends = [(r, end_time(r)) for r in formal if r.t_send is not None]
    done = [r for r, e in ends if r.ok and e is not None and a <= e <= b]
    toks = tokens_in(formal, a, b)
    tok_s = toks / dur if dur > 0 else 0.0
    return WindowFigures(
        kind=kind, start=a, end=b, duration=dur,
        n_requests=sum(1 for r in formal if r.t_send is not None and a <= r.t_send <= b),
        output_tokens=toks, output_tok_s=tok_s, output_tok_s_per_card=tok_s / max(cards, 1),
        qps=len(done) / dur if dur > 0 else 0.0,
        achieved_concurrency=time_avg_inflight(ev, a, b),
        goodput=(sum(1 for r in done if meets(r, slos)) / dur if dur > 0 else 0.0) if slos else None,
    )


def check_slos(slos: dict[str, float] | None) -> None:
    for k, v in (slos or {}).items():
        if k not in SLO_KEYS:
            raise FieldError(f"slos.{k}", "unknown SLO; use one of ttft_ms, tpot_ms, e2e_ms")
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise FieldError(f"slos.{k}", f"must be a positive number of milliseconds, got {v!r}")


def summarize(records: Sequence[RequestRecord], info: RunInfo, slos: dict[str, float] | None = None,
              native_min_requests: int = 128, native_min_seconds: float = 60.0) -> Summary:
    """All figures of one run from its raw records (warm-up records are excluded from every figure)."""
    check_slos(slos)
    formal = sorted((r for r in records if not r.warmup), key=lambda r: r.id)
    sent = [r for r in formal if r.t_send is not None]
    ok = [r for r in sent if r.ok]
    cards = max(int(info.cards), 1)
    ev = inflight_steps(sent)

    whole = None
    if sent:
        a = min(r.t_send for r in sent)
        b = max(end_time(r) for r in sent)
        whole = window("whole", sent, ev, a, b, cards, slos)

    native, reason = None, None
    bounds = native_bounds(ev, info.concurrency) if sent else None
    if not sent:
        reason = "no formal request was sent"
    elif bounds is None:
        reason = f"in-flight never reached C={info.concurrency} twice (no steady state)"
    else:
        a, b = bounds
        w = window("native", sent, ev, a, b, cards, slos)
        max_e2e = max((e2e_ms(r) or 0.0) for r in sent) / 1e3
        if w.n_requests < native_min_requests:
            reason = f"native window has {w.n_requests} requests < {native_min_requests}"
        elif w.duration < native_min_seconds:
            reason = f"native window lasts {w.duration:.2f} s < {native_min_seconds:g} s"
        elif not max_e2e < w.duration / 3:
            reason = f"max E2E {max_e2e:.2f} s >= window/3 = {w.duration / 3:.2f} s"
        else:
            native = w
        if native is None:
            reason += f" (window [{a:.3f}, {b:.3f}] would have given {w.output_tok_s_per_card:.2f} tok/s/card)"

    itl = gaps_ms(ok)
    hits = [(r.n_cached, r.n_in) for r in formal if r.n_cached is not None and r.n_in]
    outs = [n_out_of(r) for r in ok if n_out_of(r) is not None]
    fresh = [r.n_in - (r.n_cached or 0) for r in formal if r.n_in]
    defs = dict(DEFINITIONS)
    defs["native_window"] = defs["native_window"].format(min_n=native_min_requests, min_s=native_min_seconds)
    if slos:
        defs["slos"] = ", ".join(f"{k} <= {v:g}" for k, v in slos.items())
    return Summary(
        n_total=len(records), n_formal=len(formal), n_sent=len(sent), n_ok=len(ok),
        n_failed=len(formal) - len(ok), cards=cards, concurrency=info.concurrency,
        request_rate=info.request_rate, whole=whole, native=native, native_reason=reason,
        ttft_ms=dist([v for r in ok if (v := ttft_ms(r)) is not None]),
        tpot_ms=dist([v for r in ok if (v := tpot_ms(r)) is not None]),
        itl_ms=dist(itl),
        e2e_ms=dist([v for r in ok if (v := e2e_ms(r)) is not None]),
        queue_delay_ms=dist([(r.t_send - r.t_sched) * 1e3 for r in sent]),
        cache_hit=(sum(c for c, _ in hits) / sum(n for _, n in hits)) if hits else None,
        cache_hit_min_request=min(c / n for c, n in hits) if hits else None,
        prompt_uncached_mean=sum(fresh) / len(fresh) if fresh else None,
        output_len_min=int(min(outs)) if outs else None,
        output_len_max=int(max(outs)) if outs else None,
        definitions=defs,
    )


def _f(v: float | None, nd: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}"


def format_summary(s: Summary) -> str:
    """`vllm bench serve`-style text: both windows with N and duration, then latencies and definitions."""
    w = 50
    line = lambda k, v: f"{k + ':':<40}{v:>10}"  # noqa: E731
    out = [" Serving Benchmark Result ".center(w, "="),
           line("Formal requests (sent / ok / failed)", f"{s.n_sent}/{s.n_ok}/{s.n_failed}"),
           line("Concurrency cap C", s.concurrency),
           line("Request rate r (req/s)", "inf" if math.isinf(s.request_rate) else f"{s.request_rate:g}"),
           line("Cards", s.cards)]
    for name, win in (("whole", s.whole), ("native", s.native)):
        out.append(f" {name} window ".center(w, "-"))
        if win is None:
            out.append(f"no {name} figure: {s.native_reason if name == 'native' else 'no request sent'}")
            continue
        out += [line("Window [start, end] (s)", f"{win.start:.2f}-{win.end:.2f}"),
                line("Duration (s)", _f(win.duration)),
                line("Requests started in window (N)", win.n_requests),
                line("Output tokens", _f(win.output_tokens, 0)),
                line("Output token throughput (tok/s)", _f(win.output_tok_s)),
                line("Output tok/s per card", _f(win.output_tok_s_per_card)),
                line("Request throughput QPS (req/s)", _f(win.qps, 3)),
                line("Achieved concurrency", _f(win.achieved_concurrency)),
                line("Goodput (req/s)", _f(win.goodput, 3))]
    for title, d in (("Time to First Token", s.ttft_ms), ("Time per Output Token (excl. 1st token)", s.tpot_ms),
                     ("Inter-token Latency", s.itl_ms), ("End-to-end Latency", s.e2e_ms),
                     ("Client queue delay", s.queue_delay_ms)):
        key = title.split(" (")[0]
        out.append(title.center(w, "-"))
        out += [line(f"Mean {key} (ms)", _f(d.mean)), line(f"P50 {key} (ms)", _f(d.p50)),
                line(f"P90 {key} (ms)", _f(d.p90)), line(f"P99 {key} (ms)", _f(d.p99))]
    out.append(" Contract facts ".center(w, "-"))
    out += [line("Cache hit (sum cached / sum input)", _f(s.cache_hit, 4)),
            line("Lowest per-request cache hit", _f(s.cache_hit_min_request, 4)),
            line("Output length min / max", f"{s.output_len_min}/{s.output_len_max}")]
    out.append(" Definitions ".center(w, "-"))
    out += [f"{k}: {v}" for k, v in s.definitions.items()]
    out.append("=" * w)
    return "\n".join(out)

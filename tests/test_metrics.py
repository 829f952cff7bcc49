"""Every formula of docs/metrics.md on hand-built records whose answers are worked out by hand."""
import math

import pytest

from core.metrics import format_summary, summarize, tokens_in
from core.records import RequestRecord, RunInfo


def info(c=2, cards=1, n=10, rate=math.inf):
    return RunInfo(scenario="t", scenario_version=1, n=n, concurrency=c, request_rate=rate, cards=cards, output_len=4)


def rec(i, t_send, chunks, n_out=None, ok=True, warmup=False, t_sched=None, **kw):
    return RequestRecord(id=i, warmup=warmup, t_sched=t_send if t_sched is None else t_sched, t_send=t_send,
                         chunk_times=chunks, n_out=len(chunks) if n_out is None else n_out, n_out_expected=4,
                         ok=ok, **kw)


def closed_loop(c, n, dur, stagger):
    """C slots, each sending its next request the instant the previous one finishes."""
    out, i, slot_t = [], 0, [s * stagger for s in range(c)]
    while i < n:
        s = min(range(c), key=lambda k: (slot_t[k], k))
        t = slot_t[s]
        out.append(rec(i, t, [t + dur / 4 * (k + 1) for k in range(4)]))
        slot_t[s] = t + dur
        i += 1
    return out


def test_latencies_per_request():
    s = summarize([rec(0, 1.0, [1.1, 1.2, 1.3, 1.5], t_sched=0.99)], info(c=1))
    assert s.ttft_ms.mean == pytest.approx(100)
    assert s.e2e_ms.mean == pytest.approx(500)
    assert s.tpot_ms.mean == pytest.approx(400 / 3)  # excludes the first token
    assert s.itl_ms.n == 3 and s.itl_ms.mean == pytest.approx(400 / 3) and s.itl_ms.p50 == pytest.approx(100)
    assert s.queue_delay_ms.mean == pytest.approx(10)


def test_tpot_uses_usage_tokens_not_chunks_and_skips_single_token():
    # an MTP-style chunking: 2 chunks carrying 5 tokens -> TPOT spreads over n_out - 1 = 4 gaps
    s = summarize([rec(0, 0.0, [0.1, 0.5], n_out=5), rec(1, 0.0, [0.2], n_out=1)], info(c=2))
    assert s.tpot_ms.n == 1 and s.tpot_ms.mean == pytest.approx(100)
    assert s.itl_ms.n == 1 and s.itl_ms.mean == pytest.approx(400)


def test_percentiles_linear_interpolation():
    recs = [rec(i, 0.0, [(i + 1) / 1000, 1.0]) for i in range(100)]  # TTFT 1..100 ms
    d = summarize(recs, info(c=100)).ttft_ms
    assert (d.mean, d.p50, d.p90, d.p99) == pytest.approx((50.5, 50.5, 90.1, 99.01))


def test_whole_window_throughput_per_card_qps_and_concurrency():
    recs = [rec(0, 0.0, [1.0, 2.0], n_out=10), rec(1, 1.0, [3.0, 4.0], n_out=30)]
    w = summarize(recs, info(c=2, cards=4)).whole
    assert (w.start, w.end, w.duration, w.n_requests) == (0.0, 4.0, 4.0, 2)
    assert w.output_tokens == 40 and w.output_tok_s == 10 and w.output_tok_s_per_card == 2.5
    assert w.qps == 0.5
    assert w.achieved_concurrency == pytest.approx((2 + 3) / 4)  # in flight 0-2 and 1-4


def test_tokens_in_window_use_chunk_tokens_else_spread_n_out():
    a = rec(0, 0.0, [1.0, 2.0, 3.0], n_out=9, chunk_tokens=[1, 2, 6])
    b = rec(1, 0.0, [1.0, 2.0, 3.0], n_out=9)
    assert tokens_in([a], 1.5, 3.0) == 8
    assert tokens_in([b], 1.5, 3.0) == 6
    assert tokens_in([a, b], 0.0, 0.5) == 0


def test_warmup_and_failed_requests_excluded_from_latencies():
    recs = [rec(0, 0.0, [5.0, 6.0], warmup=True), rec(1, 10.0, [10.1, 10.2]),
            rec(2, 10.0, [], n_out=None, ok=False, error="boom")]
    s = summarize(recs, info(c=2))
    assert (s.n_total, s.n_formal, s.n_sent, s.n_ok, s.n_failed) == (3, 2, 2, 1, 1)
    assert s.whole.start == 10.0 and s.ttft_ms.n == 1 and s.ttft_ms.mean == pytest.approx(100)


def test_native_window_bounds_n_and_steady_figures():
    recs = closed_loop(c=2, n=20, dur=1.0, stagger=0.5)
    s = summarize(recs, info(c=2), native_min_requests=5, native_min_seconds=3.0)
    nat = s.native
    assert nat is not None, s.native_reason
    # in flight reaches 2 at 0.5 (first) and 1.0 (second: a); the last send (#19) is at 9.5, and in-flight
    # last leaves 2 when #18 (sent 9.0) finishes at 10.0 (b)
    assert (nat.start, nat.end) == (1.0, 10.0)
    assert nat.n_requests == 18  # sends at 1.0, 1.5, ..., 9.5
    assert nat.achieved_concurrency == pytest.approx(2.0)
    assert nat.qps == pytest.approx(19 / 9.0)  # completions at 1.0, 1.5, ..., 10.0
    # #2..#18 whole (68), #0's chunk at 1.0 (1), #1's at 1.0-1.5 (3), #19's at 9.75 and 10.0 (2)
    assert nat.output_tokens == 74
    assert nat.output_tok_s == pytest.approx(74 / 9.0)
    assert s.whole.duration == 10.5 and s.whole.n_requests == 20


@pytest.mark.parametrize("kw,why", [
    (dict(native_min_requests=19, native_min_seconds=3.0), "18 requests < 19"),
    (dict(native_min_requests=5, native_min_seconds=9.5), "9.00 s < 9.5"),
])
def test_native_below_minimum_is_none_with_reason(kw, why):
    s = summarize(closed_loop(c=2, n=20, dur=1.0, stagger=0.5), info(c=2), **kw)
    assert s.native is None and why in s.native_reason and s.whole is not None


def test_native_needs_max_e2e_below_a_third_of_window():
    recs = closed_loop(c=2, n=20, dur=1.0, stagger=0.5)
    recs[19] = rec(19, recs[19].t_send, [recs[19].t_send + 0.1, recs[19].t_send + 3.0])
    s = summarize(recs, info(c=2), native_min_requests=5, native_min_seconds=3.0)
    assert s.native is None and "max E2E 3.00 s" in s.native_reason


def test_native_none_when_c_never_reached():
    recs = [rec(i, float(i), [i + 0.1, i + 0.2]) for i in range(5)]
    s = summarize(recs, info(c=4), native_min_requests=1, native_min_seconds=0.0)
    assert s.native is None and "never reached C=4" in s.native_reason


def test_goodput_counts_requests_meeting_every_slo():
    recs = [rec(0, 0.0, [0.1, 0.2, 0.3]), rec(1, 0.0, [0.5, 0.6, 0.7]), rec(2, 0.0, [0.1, 0.5, 1.0])]
    # TTFT 100/500/100 ms, TPOT 100/100/450 ms; whole window 1 s
    s = summarize(recs, info(c=3), slos={"ttft_ms": 200, "tpot_ms": 200})
    assert s.whole.goodput == pytest.approx(1.0)
    assert summarize(recs, info(c=3)).whole.goodput is None
    with pytest.raises(ValueError, match="slos.latency"):
        summarize(recs, info(c=3), slos={"latency": 1})


def test_cache_hit_overall_min_and_absent():
    recs = [rec(0, 0.0, [1.0], n_in=100, n_cached=90), rec(1, 0.0, [1.0], n_in=300, n_cached=150)]
    s = summarize(recs, info(c=2))
    assert s.cache_hit == pytest.approx(240 / 400) and s.cache_hit_min_request == pytest.approx(0.5)
    s2 = summarize([rec(0, 0.0, [1.0], n_in=100)], info(c=2))
    assert s2.cache_hit is None and s2.cache_hit_min_request is None
    # the prompt tokens a prefill pass computes per request: 10 and 150 uncached; 100 when nothing was cached
    assert s.prompt_uncached_mean == pytest.approx(80.0) and s2.prompt_uncached_mean == pytest.approx(100.0)
    assert summarize([rec(0, 0.0, [1.0])], info(c=2)).prompt_uncached_mean is None  # no usage.prompt_tokens


def test_format_summary_states_windows_and_definitions():
    s = summarize(closed_loop(c=2, n=20, dur=1.0, stagger=0.5), info(c=2, cards=2))
    text = format_summary(s)
    assert "whole window" in text and "no native figure" in text
    assert "tpot: (E2E - TTFT) / (n_out - 1)" in text and "Output tok/s per card" in text

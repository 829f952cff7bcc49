"""Prometheus parsing, the evidence digest, and the live scraper against a real HTTP server."""
import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from core import records as rec
from core.records import EngineSample, PrefillBatch
from executor.evidence import WAITING, digest, parse_endpoints, parse_prometheus, role_series, scrape_loop

VLLM_TEXT = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:num_requests_waiting{engine="0",model_name="m"} 3
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:request_success_total{finished_reason="length",model_name="m"} 10
vllm:request_success_total{finished_reason="stop",model_name="m"} 2
garbage line here
vllm:spec_decode_num_drafts_total{model_name="m"} 100
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 180
"""


def test_parse_prometheus_keeps_labels_and_skips_junk():
    v = parse_prometheus(VLLM_TEXT)
    assert v['vllm:num_requests_running{engine="0",model_name="m"}'] == 7.0
    assert v['vllm:request_success_total{finished_reason="stop",model_name="m"}'] == 2
    assert len(v) == 7


def S(t, role, values, inst=None):
    return EngineSample(t=t, role=role, instance=inst or role, values=values)


def test_digest_queue_and_batch_evidence():
    samples = [S(0, "prefill", {"sglang:num_queue_reqs": 4}), S(1, "prefill", {"sglang:num_queue_reqs": 0}),
               S(0, "decode", {"vllm:num_requests_waiting": 0, "vllm:num_requests_running": 10,
                               "vllm:kv_cache_usage_perc": 0.5}),
               S(1, "decode", {"vllm:num_requests_waiting": 2, "vllm:num_requests_running": 30,
                               "vllm:kv_cache_usage_perc": 0.7})]
    batches = [PrefillBatch(t_start=0, t_end=1, instance="p0", n_reqs=1, n_tokens=8192, chunks=[8192]),
               PrefillBatch(t_start=1, t_end=2, instance="p0", n_reqs=2, n_tokens=8196, chunks=[8192, 4]),
               PrefillBatch(t_start=2, t_end=3, instance="p0", n_reqs=1, n_tokens=4, chunks=[4])]
    d = digest(samples, batches, {"prefill": {"compute": 1.0}}, None, {"max_num_batched_tokens": 8192,
                                                                       "max_num_seqs": 32})
    assert d.prefill_waiting_mean == 2 and d.prefill_waiting_nonzero_share == 0.5
    assert d.decode_waiting_mean == 1 and d.decode_waiting_nonzero_share == 0.5
    assert d.decode_running_mean == 20 and d.decode_running_max == 30 and d.decode_batch_limit == 32
    assert d.kv_usage_max == 0.7 and d.samples == 4
    assert d.prefill_batch_reqs_mean == pytest.approx(4 / 3)
    assert d.prefill_batch_tokens_mean == pytest.approx(16392 / 3)
    assert d.prefill_tail_batch_share == pytest.approx(1 / 3)
    assert d.breakdown.model_dump() == {"prefill": {"compute": 1.0}} and d.spec_accept_length is None


def test_queues_are_summed_per_role_per_scrape_round():
    """Two P and two D instances scraped a few ms apart each round: the role's queue is the sum per round."""
    W, R = "vllm:num_requests_waiting", "vllm:num_requests_running"
    samples = []
    for k, (p0, p1, d0, d1) in enumerate([(3, 0, 0, 0), (0, 0, 0, 0), (1, 1, 2, 0), (0, 2, 0, 0)]):
        t = float(k)
        samples += [S(t + 0.001, "prefill", {W: p0}, "p0"), S(t + 0.004, "prefill", {W: p1}, "p1"),
                    S(t + 0.006, "decode", {W: d0, R: 10 + k}, "d0"), S(t + 0.009, "decode", {W: d1, R: 20}, "d1")]
    d = digest(samples, [], {}, None, {"max_num_seqs": 20})
    assert d.prefill_waiting_mean == pytest.approx((3 + 0 + 2 + 2) / 4)  # per round, not per sample (7/8)
    assert d.prefill_waiting_nonzero_share == 0.75  # per sample it would be 4/8
    assert d.decode_waiting_mean == 0.5 and d.decode_waiting_nonzero_share == 0.25
    assert d.decode_running_max == 20 == d.decode_batch_limit  # per instance, against the per-instance limit
    assert d.decode_running_total_max == 33 and d.decode_running_total_mean == pytest.approx(31.5)
    assert d.prefill_instances == 2 and d.decode_instances == 2
    assert role_series(samples, "prefill", WAITING) == [(0.001, 3.0), (1.001, 0.0), (2.001, 2.0), (3.001, 2.0)]
    # a mixed instance counts for both roles; a round where nobody reported the metric is missing, not 0
    mixed = [S(0, "mixed", {W: 4}, "m0"), S(0.01, "mixed", {W: 1}, "m1"), S(1, "mixed", {}, "m0")]
    assert role_series(mixed, "prefill", WAITING) == role_series(mixed, "decode", WAITING) == [(0, 5.0)]


def test_digest_missing_evidence_is_none_and_spec_acceptance_from_counters():
    d = digest([], [], None, None, None)
    assert all(v is None for v in (d.prefill_waiting_mean, d.decode_running_max, d.kv_usage_max,
                                   d.prefill_tail_batch_share, d.decode_batch_limit))
    assert d.kv_transfer is None and d.spec_accept_per_position is None and d.breakdown.model_dump() == {} and not d.breakdown
    mk = lambda t, dr, ac: S(t, "decode", {"vllm:spec_decode_num_drafts_total": dr,  # noqa: E731
                                           "vllm:spec_decode_num_accepted_tokens_total": ac})
    assert digest([mk(0, 100, 150), mk(1, 300, 450)], [], {}, None, {}).spec_accept_length == 2.5
    llama = [S(0, "mixed", {"llamacpp:requests_processing": 3, "llamacpp:requests_deferred": 1})]
    d2 = digest(llama, [], {}, None, {})
    assert d2.decode_running_max == 3 and d2.prefill_waiting_mean == 1
    sg = [S(0, "decode", {"sglang:spec_accept_length": 3.2, "sglang:token_usage": 0.9})]
    d3 = digest(sg, [], {}, None, {})
    assert d3.spec_accept_length == 3.2 and d3.kv_usage_max == 0.9


def test_parse_endpoints_names_bad_spec():
    assert parse_endpoints(["decode=http://h:1/metrics"]) == [("decode", "http://h:1/metrics")]
    with pytest.raises(ValueError, match="'gpu=http://x'"):
        parse_endpoints(["gpu=http://x"])


class _Metrics(BaseHTTPRequestHandler):
    hits = 0

    def body(self) -> bytes:
        type(self).hits += 1
        return f"vllm:num_requests_running {type(self).hits}\n".encode()

    def do_GET(self):  # noqa: N802
        body = self.body()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


async def test_scraper_appends_samples_until_stopped(tmp_path):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    stop = asyncio.Event()
    path = tmp_path / rec.METRICS
    task = asyncio.create_task(scrape_loop([("decode", url)], path, time.perf_counter_ns(), stop, interval_s=0.05))
    while _Metrics.hits < 3:  # bounded by the test timeout; progresses on the scraper's own schedule
        await asyncio.sleep(0.01)
    stop.set()
    n = await asyncio.wait_for(task, 5)
    srv.shutdown()
    got = list(rec.read_jsonl(path, EngineSample))
    assert n == len(got) >= 3 and got[0].role == "decode" and got[0].values["vllm:num_requests_running"] >= 1
    assert [s.t for s in got] == sorted(s.t for s in got)

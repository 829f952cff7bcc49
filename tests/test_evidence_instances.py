"""Every engine instance scraped and digested apart: the scraper keeps each named instance's series, the digest
gives each instance its own figures and each role the spread over its instances, the KV hand-off is the sum over
instances, and the report names the instance that carries the most and the least."""
import asyncio
import threading
import time
from http.server import ThreadingHTTPServer

import pytest
from test_evidence import _Metrics

from agent.report.experiment import evidence_words
from core import records as rec
from core.records import EngineSample
from executor.evidence import digest, parse_endpoints, scrape_loop
from core.evidence_decode import expert_load

REMOTE = 'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}'
XFERS = "vllm:nixl_xfer_time_seconds_count"
FAILED = "vllm:nixl_num_failed_transfers_total"
DONE = 'vllm:request_success_total{finished_reason="length"}'
RUN, WAIT, KV = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"


def test_metrics_urls_name_each_instance_and_refuse_one_given_twice():
    got = parse_endpoints(["prefill-0=http://h:1/metrics", "decode-0=http://h:2/metrics", "decode-1=http://h:3/m",
                           "mixed=http://h:4/metrics"])
    assert [n for n, _ in got] == ["prefill-0", "decode-0", "decode-1", "mixed"]
    with pytest.raises(ValueError, match="'decode-1=http://h:9/m': instance decode-1 is given twice"):
        parse_endpoints(["decode-1=http://h:3/m", "decode-1=http://h:9/m"])
    with pytest.raises(ValueError, match="'decode-x=http://h:3/m': expected NAME=URL"):
        parse_endpoints(["decode-x=http://h:3/m"])


def _server(text: str) -> tuple[ThreadingHTTPServer, str]:
    """A real /metrics endpoint answering `text` (the scraper test's handler, with a fixed body)."""
    handler = type("Fixed", (_Metrics,), {"body": lambda self: text.encode()})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/metrics"


async def test_two_instances_of_a_role_are_scraped_and_recorded_apart(tmp_path):
    """Two decode instances at two real endpoints: each keeps its own series under its service name."""
    servers = [_server(f"{RUN} {n}\n") for n in (3, 7)]
    stop = asyncio.Event()
    path = tmp_path / rec.METRICS
    endpoints = parse_endpoints([f"decode-{i}={url}" for i, (_, url) in enumerate(servers)])
    task = asyncio.create_task(scrape_loop(endpoints, path, time.perf_counter_ns(), stop, interval_s=0.05))
    while not path.exists() or len(path.read_text().splitlines()) < 4:
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 5)
    for srv, _ in servers:
        srv.shutdown()
    got = list(rec.read_jsonl(path, EngineSample))
    by = {s.instance: s.values[RUN] for s in got}
    assert by == {"decode-0": 3.0, "decode-1": 7.0} and {s.role for s in got} == {"decode"}
    ev = digest(got, [], {}, None, {"max_num_seqs": 8})
    assert ev.decode_instances == 2 and ev.instances["decode-1"].batch_fill == pytest.approx(7 / 8)
    assert ev.instance_spread["decode"]["running_mean"].model_dump() == {"max_over_mean": 1.4, "max": "decode-1",
                                                                          "min": "decode-0"}


def _pd_samples() -> list[EngineSample]:
    """1 P + 2 D over 3 scrape rounds: the router sent decode-1 three requests for decode-0's one, decode-1's batch
    and KV are fuller, and decode-0 had one failed transfer after the first measured send (t = 0.5)."""
    out = []
    for k in range(3):
        t = float(k)
        out += [EngineSample(t=t, role="prefill", instance="prefill-0",
                             values={WAIT: 1.0, RUN: 1.0, DONE: 4.0 * k, FAILED: 0.0}),
                EngineSample(t=t + 0.01, role="decode", instance="decode-0",
                             values={RUN: 1.0, WAIT: 0.0, KV: 0.1, DONE: 1.0 * k, REMOTE: 100.0 * k, XFERS: 1.0 * k,
                                     FAILED: 1.0 if k == 2 else 0.0}),
                EngineSample(t=t + 0.02, role="decode", instance="decode-1",
                             values={RUN: 3.0, WAIT: 2.0, KV: 0.4, DONE: 3.0 * k, REMOTE: 300.0 * k, XFERS: 3.0 * k,
                                     FAILED: 0.0})]
    return out


def test_each_instance_is_digested_apart_and_the_hand_off_is_their_sum():
    ev = digest(_pd_samples(), [], {}, None, {"max_num_seqs": 4}, measured_from=lambda: 0.5)
    d0, d1, p0 = ev.instances["decode-0"], ev.instances["decode-1"], ev.instances["prefill-0"]
    assert (d0.requests, d1.requests, p0.requests) == (2.0, 6.0, 8.0)
    assert (d0.kv_tokens_remote, d1.kv_tokens_remote) == (200.0, 600.0)
    assert (d0.kv_transfers, d1.kv_transfers, d0.kv_failed, d1.kv_failed) == (2.0, 6.0, 1.0, 0.0)
    assert (d0.batch_fill, d1.batch_fill, p0.batch_fill) == (0.25, 0.75, None)
    assert p0.role == "prefill" and d1.kv_usage_max == 0.4 and d1.waiting_mean == 2.0
    # the combined hand-off is the instances' sum
    assert ev.kv_transfer.kv_tokens_remote == 800.0 == d0.kv_tokens_remote + d1.kv_tokens_remote
    assert ev.kv_transfer.kv_transfers == 8.0 and ev.kv_transfer.failed == 1.0
    # the router's balance over decode: decode-1 served 1.5x the mean, decode-0 the least
    spread = ev.instance_spread["decode"]
    assert spread["requests"].model_dump() == {"max_over_mean": 1.5, "max": "decode-1", "min": "decode-0"}
    assert spread["kv_usage_max"].max == "decode-1" and "prefill" not in ev.instance_spread  # one P: no spread
    even = digest([s for s in _pd_samples() if s.instance == "decode-0"]
                  + [s.model_copy(update={"instance": "decode-1"}) for s in _pd_samples() if s.instance == "decode-0"],
                  [], {}, None, {})
    assert even.instance_spread["decode"]["requests"].model_dump() == {"max_over_mean": 1.0, "max": "decode-0",
                                                                       "min": "decode-1"}
    words = evidence_words(ev)
    assert "decode instances: requests served decode-1 1.50x the mean (least decode-0)" in words, words


def test_one_instance_per_role_has_figures_but_no_spread():
    one = [s for s in _pd_samples() if s.instance != "decode-1"]
    ev = digest(one, [], {}, None, {})
    assert set(ev.instances) == {"prefill-0", "decode-0"} and ev.instance_spread is None
    assert ev.instances["decode-0"].batch_fill is None  # no batch limit known
    assert digest([], [], {}, None, {}).instances is None


def test_expert_load_names_the_worst_instance():
    load = expert_load({"decode": {"decode-0": {"per_rank_tokens": [10, 10, 10, 10]},
                                   "decode-1": {"per_rank_tokens": [40, 10, 10, 20]}}})["decode"]
    assert load["worst_instance"] == "decode-1" and load["max_over_mean"] == 2.0
    assert load["per_instance"] == {"decode-0": 1.0, "decode-1": 2.0}

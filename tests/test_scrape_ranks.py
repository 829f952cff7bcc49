"""Every instance and rank measured (issue 55, part 3): the scraper polls every endpoint concurrently through its own
loop against real HTTP servers (a silent endpoint costs only its own samples, a slow one never holds the load past
its end); the digest keeps each DP / EP rank apart and combines each figure over an instance's ranks; KV use per
role; SGLang's failed KV hand-offs and MindIE's metrics read by the names their engines export."""
import asyncio
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from agent.planner.rules import kv_capacity, rank_straggler
from agent.planner.rules.base import Ctx
from agent.report.experiment import evidence_words
from core import records as rec
from core.records import EngineSample
from executor.evidence import digest, parse_endpoints, parse_prometheus, scrape_loop
from ports_support import free_ports
from test_evidence import _Metrics

RELEASE = threading.Event()  # the silent endpoints answer nothing until the test is over


class _Endpoint(_Metrics):
    """A /metrics endpoint: `text(hits)` after `delay_s`; a silent one holds the connection without answering."""

    silent = False
    delay_s = 0.0
    hits = 0

    def text(self, hits: int) -> str:
        return f"vllm:num_requests_running {hits}\n"

    def body(self) -> bytes:
        type(self).hits += 1
        return self.text(type(self).hits).encode()

    def do_GET(self):  # noqa: N802
        if self.silent:
            RELEASE.wait()
            return
        time.sleep(self.delay_s)
        super().do_GET()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # the scraper dropped a late answer's connection: expected
        pass


def _serve(port: int, **attrs) -> ThreadingHTTPServer:
    srv = _Server(("127.0.0.1", port), type("Endpoint", (_Endpoint,), dict(attrs)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def servers():
    started: list[ThreadingHTTPServer] = []
    RELEASE.clear()
    yield lambda port, **attrs: started.append(_serve(port, **attrs)) or f"http://127.0.0.1:{port}/metrics"
    RELEASE.set()
    for srv in started:
        srv.shutdown()
        srv.server_close()


async def test_28_answering_endpoints_are_each_sampled_three_times_in_3_5_s_beside_4_silent(tmp_path, servers):
    """Polled one after another with a timeout each, 4 silent endpoints made every round last 4 s and each answering
    endpoint was sampled once in 3.5 s; polled concurrently, every answering one is sampled each second."""
    ports = free_ports(32)
    specs = [f"decode-{i}={servers(p, silent=i >= 28)}" for i, p in enumerate(ports)]
    path, stop = tmp_path / rec.METRICS, asyncio.Event()
    t0 = time.perf_counter_ns()
    task = asyncio.create_task(scrape_loop(parse_endpoints(specs), path, t0, stop))
    await asyncio.sleep(3.5)
    stop.set()
    written = await asyncio.wait_for(task, 10)
    got = list(rec.read_jsonl(path, EngineSample))
    closing = max(s.model_extra["round"] for s in got)
    early = [s for s in got if s.t <= 3.5 and s.model_extra["round"] < closing]  # on the samples' own clock
    per = {f"decode-{i}": sum(1 for s in early if s.instance == f"decode-{i}") for i in range(32)}
    assert all(per[f"decode-{i}"] >= 3 for i in range(28)), per
    assert not any(s.instance in {f"decode-{i}" for i in range(28, 32)} for s in got)  # silent: gaps, no samples
    assert written == len(got) and {s.instance for s in got if s.model_extra["round"] == closing} == \
        {f"decode-{i}" for i in range(28)}  # the closing round asked every endpoint again


async def test_a_slow_instance_does_not_hold_the_scraper_past_the_end_of_the_load(tmp_path, servers):
    """One instance whose /metrics takes 1.2 s, longer than the interval: the stop used to be missed (the wait for it
    ran with a 0 s timeout, which raises even when the event is set) and the load generator awaited the scraper
    forever; now the scraper closes within one request timeout of the stop."""
    fast, slow = free_ports(2)
    endpoints = parse_endpoints([f"decode-0={servers(fast)}", f"decode-1={servers(slow, delay_s=1.2)}"])
    path, stop = tmp_path / rec.METRICS, asyncio.Event()
    task = asyncio.create_task(scrape_loop(endpoints, path, time.perf_counter_ns(), stop))

    async def slow_answered() -> None:
        while not path.exists() or "decode-1" not in path.read_text():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(slow_answered(), 10)  # it answers in 1.2 s: a scraper's timeout must allow that
    stop.set()
    await asyncio.wait_for(task, 3.0)
    got = list(rec.read_jsonl(path, EngineSample))
    closing = max(s.model_extra["round"] for s in got)
    assert {s.instance for s in got if s.model_extra["round"] == closing} == {"decode-0", "decode-1"}
    fast_rounds = {s.model_extra["round"] for s in got if s.instance == "decode-0"}
    slow_rounds = {s.model_extra["round"] for s in got if s.instance == "decode-1"}
    assert len(fast_rounds) > len(slow_rounds)  # the fast one was not held back to the slow one's pace


def _vllm_dp(step_s: list[float], waiting: list[int], kv: list[float]):
    """A vLLM instance of len(step_s) DP engines, as its /metrics reads after `hits` scrapes: engine r has emitted
    10 tokens per scrape at step_s[r] apart (the inter-token-latency histogram) and holds waiting[r] requests."""
    def text(self, hits: int) -> str:
        lines = []
        for r, (s, w, k) in enumerate(zip(step_s, waiting, kv)):
            lab = f'engine="{r}",model_name="m"'
            lines += [f"vllm:num_requests_running{{{lab}}} {8 + r}", f"vllm:num_requests_waiting{{{lab}}} {w}",
                      f'vllm:num_requests_waiting_by_reason{{{lab},reason="capacity"}} {w}',
                      f"vllm:kv_cache_usage_perc{{{lab}}} {k}",
                      f"vllm:inter_token_latency_seconds_sum{{{lab}}} {10 * hits * s}",
                      f"vllm:inter_token_latency_seconds_count{{{lab}}} {10 * hits}"]
        return "\n".join(lines) + "\n"
    return text


async def _scrape(tmp_path, endpoints: list[str], rounds: int) -> list[EngineSample]:
    """Scrape real endpoints through the scraper's own loop until `rounds` rounds are in, then stop."""
    path, stop = tmp_path / rec.METRICS, asyncio.Event()
    task = asyncio.create_task(scrape_loop(parse_endpoints(endpoints), path, time.perf_counter_ns(), stop,
                                           interval_s=0.05))
    while not path.exists() or len({s.model_extra["round"] for s in rec.read_jsonl(path, EngineSample)}) < rounds:
        await asyncio.sleep(0.02)
    stop.set()
    await asyncio.wait_for(task, 10)
    return list(rec.read_jsonl(path, EngineSample))


async def test_each_dp_rank_is_kept_apart_and_combined_per_figure(tmp_path, servers):
    """A decode instance of 4 DP engines where engine 2 steps 3x slower with a queue, beside a prefill instance
    whose KV is full: per rank figures, sums and maxima over the ranks, the slowest rank named; decode's KV use is
    decode's, not the pooled peak prefill's KV sets."""
    p, d = free_ports(2)
    decode = servers(d, text=_vllm_dp([0.02, 0.021, 0.06, 0.02], [0, 1, 9, 0], [0.5, 0.52, 0.61, 0.5]))
    prefill = servers(p, text=lambda self, hits: 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.99\n')
    ev = digest(await _scrape(tmp_path, [f"prefill-0={prefill}", f"decode-0={decode}"], 4), [], {}, None,
                {"max_num_seqs": 16})
    assert set(ev.ranks) == {"decode-0"}  # the prefill instance has one rank: its instance figures say it all
    g = ev.ranks["decode-0"]
    assert g.role == "decode" and set(g.ranks) == {f"engine={r}" for r in range(4)}
    assert g.ranks["engine=2"].step_s == pytest.approx(0.06) and g.ranks["engine=0"].step_s == pytest.approx(0.02)
    step, wait, run = g.combined["step_s"], g.combined["waiting_mean"], g.combined["running_mean"]
    assert step.worst == "engine=2" and step.max == pytest.approx(0.06) and step.median == pytest.approx(0.0205)
    assert wait.worst == "engine=2" and wait.sum == pytest.approx(10) and run.sum == pytest.approx(8 + 9 + 10 + 11)
    assert g.combined["kv_usage_max"].max == pytest.approx(0.61) and step.ranks == 4
    assert ev.kv_usage_max == pytest.approx(0.99)  # pooled over both roles, as before
    assert ev.decode_kv_usage_max == pytest.approx(0.61) and ev.prefill_kv_usage_max == pytest.approx(0.99)
    # the rule reads decode's KV: prefill's full cache is not it
    ctx = Ctx(summary=None, ev=ev, limit=None, knobs={})
    assert kv_capacity.score(ctx).evidence_against == ["KV cache usage peaked at 61%"]
    # the straggler rule names the rank that gates the group's steps, and its queue
    h = rank_straggler.score(ctx)
    assert h.status == "supported" and len(h.evidence_for) == 2, h
    assert h.evidence_for[0].startswith("decode-0: rank engine=2 steps in 60.0 ms, 2.9x the median of its 4 ranks")
    assert h.evidence_for[1].startswith("decode-0: rank engine=2 holds 9.0 waiting")
    assert "decode-0 (4 ranks): slowest engine=2 at 60.0 ms a step (median 20.5 ms)" in evidence_words(ev)


async def test_rank_endpoints_are_ranks_of_one_instance(tmp_path, servers):
    """An instance whose ranks serve their own /metrics (one process per DP rank): `decode-0.r0`, `decode-0.r1` are
    two ranks of decode-0, counted as one decode instance."""
    a, b = free_ports(2)
    got = await _scrape(tmp_path, [f"decode-0.r0={servers(a, text=_vllm_dp([0.02], [0], [0.3]))}",
                                   f"decode-0.r1={servers(b, text=_vllm_dp([0.025], [1], [0.4]))}"], 3)
    ev = digest(got, [], {}, None, {})
    assert ev.decode_instances == 1 and set(ev.ranks["decode-0"].ranks) == {"r0,engine=0", "r1,engine=0"}
    assert ev.ranks["decode-0"].combined["step_s"].worst == "r1,engine=0"
    # ranks this close are no straggler; an engine that labels no rank (the simulator) gives no evidence at all
    h = rank_straggler.score(Ctx(summary=None, ev=ev, limit=None, knobs={}))
    assert h.status == "weak" and h.evidence_against[0].startswith("no rank far from its group's median")
    bare = digest([S(0, "decode", "decode-0", {"vllm:num_requests_running": 3.0})], [], {}, None, {})
    assert bare.ranks is None
    assert rank_straggler.score(Ctx(summary=None, ev=bare, limit=None, knobs={})).likelihood == rank_straggler.WEAK
    with pytest.raises(ValueError, match="'decode.r1=http://h:1/m': expected NAME=URL"):
        parse_endpoints(["decode.r1=http://h:1/m"])  # a rank belongs to a named instance


def S(t, role, inst, values):
    return EngineSample(t=t, role=role, instance=inst, values=values)


def test_sglang_hand_off_failures_latency_and_size():
    """SGLang counts failed KV transfers and failed P/D bootstraps on both roles (the hand-off's failures), and each
    transfer prefill sent in its latency (ms) and size (MiB) histograms."""
    lab = '{model_name="m",engine_type="prefill",tp_rank="0",pp_rank="0",moe_ep_rank="0"}'
    xfer, boot = f"sglang:num_transfer_failed_reqs_total{lab}", f"sglang:num_bootstrap_failed_reqs_total{lab}"
    n, ms, mib = (f"sglang:kv_transfer_{k}{lab}" for k in ("latency_ms_count", "latency_ms_sum", "total_mb_sum"))
    samples = [S(0, "prefill", "prefill-0", {boot: 0, xfer: 0, n: 2, ms: 30, mib: 4}),
               S(0.01, "decode", "decode-0", {boot: 1, xfer: 0}),
               S(1, "prefill", "prefill-0", {boot: 2, xfer: 0, n: 6, ms: 130, mib: 12}),
               S(1.01, "decode", "decode-0", {boot: 1, xfer: 3})]
    ev = digest(samples, [], {}, None, {})
    kv = ev.kv_transfer
    assert kv.kv_failed_bootstraps == 2 and kv.kv_failed_transfers == 3 and kv.failed == 5
    assert ev.instances["prefill-0"].kv_failed == 2 and ev.instances["decode-0"].kv_failed == 3
    assert kv.kv_sent == 4 and kv.transfer_s_mean == pytest.approx(0.025) and kv.bytes_per_transfer == 2 * 2 ** 20


def test_mindie_figures_are_read_from_its_exporter_names():
    """MindIE's exporter (num_requests_running / _waiting, npu_cache_usage_perc, request_success_total): every
    figure was None before its adapter mapped them."""
    text = ('# TYPE num_requests_running gauge\nnum_requests_running{model_name="m"} %d\n'
            'num_requests_waiting{model_name="m"} %d\nnpu_cache_usage_perc{model_name="m"} %s\n'
            'request_success_total{model_name="m"} %d\n')
    samples = [S(0, "mixed", "mixed-0", parse_prometheus(text % (6, 2, "0.4", 10))),
               S(1, "mixed", "mixed-0", parse_prometheus(text % (8, 0, "0.7", 25)))]
    ev = digest(samples, [], {}, None, {})
    assert ev.decode_running_max == 8 and ev.prefill_waiting_mean == 1 and ev.decode_kv_usage_max == 0.7
    assert ev.instances["mixed-0"].requests == 15

"""Evidence from each engine's own /metrics names: recorded exposition texts per engine (tests/data/metrics/,
in the names and labels of vLLM 0.32 vllm/v1/metrics/loggers.py, SGLang 0.5.23 srt/observability/
metrics_collector.py and a current llama-server) go through the real parser and the digest; the simulator
emits the same names as the engines it imitates, and none of the removed ones."""
from __future__ import annotations

from pathlib import Path

import pytest

from core import profiles
from core.records import EngineSample
from executor.engines import ADAPTERS
from executor.evidence import digest, parse_prometheus
from simulator.cluster import Cluster

DATA = Path(__file__).parent / "data" / "metrics"
REMOVED = ("vllm:gpu_cache_usage_perc", "llamacpp:kv_cache_usage_ratio", "sglang:num_prefill_prealloc_queue_reqs")


def _sample(t: float, role: str, name: str, inst: str | None = None) -> EngineSample:
    return EngineSample(t=t, role=role, instance=inst or role, values=parse_prometheus((DATA / name).read_text()))


def test_vllm_dp_decode_capacity_apart_from_deferred_and_fractions_are_maxima():
    s = [_sample(0, "decode", "vllm-decode-dp2.txt"), _sample(1, "decode", "vllm-decode-dp2.txt")]
    d = digest(s, [], None, None, {"max_num_seqs": 64})
    assert d.decode_waiting_mean == 3  # reason="capacity" over both DP engines, not num_requests_waiting (12)
    assert d.decode_deferred_mean == 9  # waiting for remote KV, reported apart
    assert d.kv_usage_max == pytest.approx(0.62)  # the fuller DP engine, not the sum 1.17
    assert d.decode_running_max == 64 == d.decode_batch_limit  # the limit holds per DP engine
    assert d.decode_running_total_max == 124
    assert d.spec_accept_length == pytest.approx(1.8)


def test_vllm_prefill_batches_from_the_iteration_tokens_histogram():
    s = [_sample(0, "prefill", "vllm-prefill-1.txt"), _sample(1, "prefill", "vllm-prefill-2.txt")]
    d = digest(s, [], None, None, {"max_num_batched_tokens": 8192})
    assert d.prefill_batch_source == "vllm:iteration_tokens_total" and d.n_prefill_batches == 10
    assert d.prefill_batch_tokens_mean == pytest.approx((164320 - 81920) / 10)
    assert d.prefill_tail_batch_share == pytest.approx(0.4)  # 4 of the 10 new steps at <= 1024 tokens
    assert d.prefill_waiting_mean == 2
    mixed = digest([_sample(0, "mixed", "vllm-prefill-1.txt")], [], None, None, {"max_num_batched_tokens": 8192})
    assert mixed.prefill_batch_tokens_mean is None  # a mixed instance's steps are mostly decode


def test_sglang_pd_queues_enter_the_digest():
    s = [_sample(0, "prefill", "sglang-prefill.txt"), _sample(0, "decode", "sglang-decode.txt")]
    d = digest(s, [], None, None, {"max_num_seqs": 48})
    assert (d.prefill_waiting_mean, d.prefill_bootstrap_mean, d.prefill_inflight_mean) == (6, 3, 1)
    assert (d.decode_waiting_mean, d.decode_prealloc_mean, d.decode_deferred_mean) == (1, 4, 4)
    assert d.kv_usage_max == pytest.approx(0.8) and d.decode_running_max == 44
    assert d.spec_accept_length == pytest.approx(2.5)


def test_llamacpp_current_names():
    d = digest([_sample(0, "mixed", "llamacpp.txt")], [], None, None, {"parallel": 4})
    assert (d.decode_running_max, d.decode_waiting_mean, d.decode_busy_slots_mean) == (4, 2, 3.5)
    assert d.kv_usage_max is None  # llama.cpp exports no KV-usage gauge any more


def test_no_adapter_reads_a_removed_name():
    names = {n for a in ADAPTERS.values() for ns in a.metrics.values() for n in ns}
    assert not names & set(REMOVED)


def test_the_simulator_emits_the_names_of_the_engines_it_imitates():
    cl = Cluster(profiles.load("dsv4-flash-910c-p8d8"), {}, seed=0)
    text = cl.metrics_text(1.0)
    exported = {k.split("{")[0] for k in parse_prometheus(text)}
    for engine in ("vllm", "sglang"):
        for key, names in ADAPTERS[engine].metrics.items():
            if key in ("iteration_tokens", "accept_length", "spec_drafts", "spec_accepted"):
                continue  # prefill batches come from the simulator's own batch log; spec only with MTP
            if key == "itl" or engine == "sglang" and key.startswith(("kv_failed_", "kv_sent")):
                continue  # no per-rank step time (the simulator labels no rank); its hand-off speaks NIXL's names
            assert {n.split("{")[0] for n in names} <= exported, (engine, key)
    assert not any(r in text for r in REMOVED)
    values = parse_prometheus(text)
    assert any('reason="capacity"' in k and 'role="decode"' in k for k in values)  # labels merged, still parseable

"""What a simulated cluster exposes to a scrape: per instance, the Prometheus series a vLLM / SGLang engine would
export (snapshot, samples, the text exposition), and the run's time breakdown per role.

Apart from the cluster's event loop (simulator.cluster) because it only reads the cluster's state: a batch run
scrapes every instance once per simulated second, the HTTP server on each /metrics request.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from core.records import EngineSample
from simulator.construct import construct
from simulator.decode import DecodeInstance

Cluster = Any  # a simulator.cluster.Cluster (it calls in here: importing it back would make a circle)


@lru_cache(maxsize=None)
def _per_pos_names(k: int) -> tuple[str, ...]:
    return tuple(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}' for i in range(k))


def snapshot(cl: Cluster) -> list[tuple[str, str, dict[str, float]]]:
    """(role, instance, Prometheus name -> value) for every instance at the current clock."""
    if cl.mixed:
        return _mixed_snapshot(cl)
    out = []
    for i, p in enumerate(cl.prefill):
        waiting, running = float(p.waiting()), float(p.running())
        values = {
            "vllm:num_requests_running": running,
            "vllm:num_requests_waiting": float(waiting),
            'vllm:num_requests_waiting_by_reason{reason="capacity"}': float(waiting),
            'vllm:num_requests_waiting_by_reason{reason="deferred"}': 0.0,
            "vllm:kv_cache_usage_perc": p.cache.usage,
            "vllm:prefix_cache_queries_total": float(p.cache.queries),
            "vllm:prefix_cache_hits_total": float(p.cache.hits),
            "vllm:prompt_tokens_total": float(p.prompt_tokens),
            "sglang:num_running_reqs": running,
            "sglang:num_queue_reqs": float(waiting),
            "sglang:num_prefill_bootstrap_queue_reqs": float(waiting),  # SGLang's name (was ..._prealloc_...)
            "sglang:num_prefill_inflight_queue_reqs": float(cl._p_inflight[i]),
            "sglang:cache_hit_rate": p.cache.hits / p.cache.queries if p.cache.queries else 0.0,
        }
        for r, h in enumerate(p.iterations):
            values.update(h.series(_engine_label(r)))
        out.append(("prefill", p.name, values))
    for d in cl.decode:
        values = _decode_values(d)
        values.update(_handoff_values(cl, d))
        out.append(("decode", d.name, values))
    return out


@lru_cache(maxsize=None)
def _engine_label(rank: int) -> str:
    return f'engine="{rank}"'


def _mixed_snapshot(cl: Cluster) -> list[tuple[str, str, dict[str, float]]]:
    """One engine per mixed instance: its decode figures, its prompt counters, running = decoding + prefilling."""
    out = []
    for m in cl.mixed:
        p, d = m.p, m.d
        v = _decode_values(d)
        waiting = p.waiting() - m.prefilling() + len(d.waiting)
        v |= {"vllm:num_requests_running": float(d.batch + m.prefilling()),
              "vllm:num_requests_waiting": float(waiting),
              'vllm:num_requests_waiting_by_reason{reason="capacity"}': float(waiting),
              'vllm:num_requests_waiting_by_reason{reason="deferred"}': 0.0,
              "vllm:prefix_cache_queries_total": float(p.cache.queries),
              "vllm:prefix_cache_hits_total": float(p.cache.hits),
              "vllm:prompt_tokens_total": float(p.prompt_tokens + p.cache.hits),
              "sglang:num_running_reqs": float(d.batch + m.prefilling()),
              "sglang:num_queue_reqs": float(waiting)}
        out.append(("mixed", d.name, v))
    return out


def _decode_values(d: DecodeInstance) -> dict[str, float]:
    steps = d.resident_steps()
    gen = d.generated_tokens()
    drafts = steps if d.k else 0
    accepted = max(0.0, gen - d.success - d.batch - steps) if d.k else 0.0
    values = dict(zip(_per_pos_names(d.k), d.accepted_per_position()))
    values.update(d.iterations.series())
    values.update({
        "vllm:num_requests_running": float(d.batch),
        # vLLM counts requests waiting for remote KV (deferred) in num_requests_waiting too
        "vllm:num_requests_waiting": float(len(d.waiting) + d.inbound),
        'vllm:num_requests_waiting_by_reason{reason="capacity"}': float(len(d.waiting)),
        'vllm:num_requests_waiting_by_reason{reason="deferred"}': float(d.inbound),
        "vllm:kv_cache_usage_perc": d.kv_usage(),
        "vllm:num_preemptions_total": 0.0,
        "vllm:generation_tokens_total": float(gen),
        "vllm:request_success_total": float(d.success),
        "vllm:spec_decode_num_drafts_total": float(drafts),
        "vllm:spec_decode_num_draft_tokens_total": float(drafts * d.k),
        "vllm:spec_decode_num_accepted_tokens_total": float(accepted),
        "sglang:num_running_reqs": float(d.batch),
        "sglang:num_queue_reqs": float(len(d.waiting)),
        "sglang:token_usage": d.kv_usage(),
        "sglang:num_decode_prealloc_queue_reqs": float(len(d.waiting)),
        "sglang:num_decode_transfer_queue_reqs": float(d.inbound),
        "sglang:spec_accept_length": (1 + accepted / drafts) if drafts else 1.0,
    })
    return values


def _handoff_values(cl: Cluster, d: DecodeInstance) -> dict[str, float]:
    """The KV hand-off into a PD decode instance, as vLLM's NIXL connector counts it (a simulated link never
    fails)."""
    return {
        'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}': float(d.kv_tokens_in),
        'vllm:prompt_tokens_by_source_total{source="local_compute"}': 0.0,
        'vllm:prompt_tokens_by_source_total{source="local_cache_hit"}': 0.0,
        "vllm:nixl_bytes_transferred_sum": d.kv_tokens_in * cl.profile.transfer.kv_bytes_per_token,
        "vllm:nixl_xfer_time_seconds_count": float(d.kv_transfers),
        "vllm:nixl_xfer_time_seconds_sum": d.kv_transfer_s,
        "vllm:nixl_num_failed_transfers_total": 0.0,
        "vllm:nixl_num_failed_notifications_total": 0.0,
        "vllm:nixl_num_kv_expired_reqs_total": 0.0,
        "vllm:nixl_num_notifications_after_expiry_total": 0.0,
    }


def samples(cl: Cluster, t: float) -> list[EngineSample]:
    """One scrape of every instance. Built without validation (a run scrapes every simulated second): every value
    is a float already, as the validated model would hold it."""
    return [construct(EngineSample, t=t, role=role, instance=name, values=v) for role, name, v in snapshot(cl)]


def metrics_text(cl: Cluster) -> str:
    """Prometheus text exposition of snapshot(), labelled by role and instance."""
    series: dict[str, list[str]] = {}
    for role, name, values in snapshot(cl):
        for metric, v in values.items():
            base, _, extra = metric.partition("{")  # a series' own labels (position="i", reason="capacity")
            labels = f'role="{role}",instance="{name}"' + (f",{extra[:-1]}" if extra else "")  # follow role, instance
            series.setdefault(base, []).append(f"{base}{{{labels}}} {v:.6g}")
    lines: list[str] = []
    for metric, rows in series.items():
        lines.append(f"# TYPE {metric} {'counter' if metric.endswith('_total') else 'gauge'}")
        lines += rows
    return "\n".join(lines) + "\n"


def breakdown(cl: Cluster, elapsed: float) -> dict[str, dict[str, float]]:
    """Instance-seconds per role: compute / communication / scheduling / imbalance (waiting on the most
    loaded EP rank) / draft (MTP passes) / idle, which add up to elapsed x instances (the profile evidence)."""
    out: dict[str, dict[str, float]] = {}
    for role, insts in (("prefill", cl.prefill), ("decode", cl.decode)):
        busy = sum(x.busy_s for x in insts)
        sched = sum(x.sched_s for x in insts)
        comm = sum(x.comm_s for x in insts)
        imb = sum(x.imbalance_s for x in insts)
        draft = sum(x.draft_s for x in insts)
        total = elapsed * len(insts)
        out[role] = {"instances": float(len(insts)), "elapsed_s": elapsed,
                     "compute_s": busy - sched - comm - imb - draft, "communication_s": comm,
                     "scheduling_s": sched, "imbalance_s": imb, "draft_s": draft,
                     "idle_s": max(0.0, total - busy),
                     "busy_share": busy / total if total > 0 else 0.0}
    return out

"""KV hand-off evidence of a PD deployment: did decode receive prefill's KV, how much, how fast, and did any
hand-off fail.

Every figure is a counter differenced over the run per instance (first to last scrape of that instance; the
failures from its last scrape before the first measured request, see kv_transfer) and summed over decode's
instances (failures and expiries over both roles' instances: prefill counts leases that
expired and reads that came after); the names are the engine adapter's (`kv_*` keys of its `metrics`). On vLLM
(checked on a real NIXL pair): decode's prompt tokens by source (`external_kv_transfer` = KV that arrived from
prefill, `local_compute` = recomputed on decode, `local_cache_hit` = decode's own prefix cache) and NIXL's
transfer histograms and failure counters. On SGLang (any transfer backend: mooncake, nixl, ascend, ...): its
scheduler's failed transfers and failed bootstraps (the P/D handshake), counted by both roles, and the transfers
prefill sent with their latency and size (`kv_sent*`, its per-request histograms). `remote_share` is the
share of decode's prompt tokens that arrived as KV; a deployment that recomputes on decode shows it well below 1.
Missing counters give None, never 0.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from core.records import EngineSample
from executor.engines import metric_names
from executor.promseries import base_value

KEYS = ("kv_tokens_remote", "kv_tokens_computed", "kv_tokens_cached", "kv_bytes", "kv_transfers",
        "kv_transfer_seconds", "kv_failed_transfers", "kv_failed_notifications", "kv_expired", "kv_late_reads",
        "kv_failed_bootstraps", "kv_sent", "kv_sent_ms", "kv_sent_mib")
# what failed: transfers (vLLM's count includes failed handshakes and notifications, kv_failed_notifications
# repeats the latter) and reads that completed after prefill had released the blocks (`kv_late_reads`: decode
# may have read reused blocks). A lease that expired (`kv_expired`, counted by prefill) is not a failure by itself:
# vLLM counts it apart from transport health, as a sign that decode took longer than the lease to pull (a busy
# decode, or a lease shorter than its queue); decode either read the blocks before (harmless) or reads them after,
# which is a late read. A failed bootstrap (SGLang: prefill and decode never agreed on the hand-off, the request is
# aborted) is a failure too. These are summed over both roles, the rest is decode's.
FAILURES = ("kv_failed_transfers", "kv_late_reads", "kv_failed_bootstraps")
BOTH_ROLES = ("kv_failed_transfers", "kv_failed_notifications", "kv_expired", "kv_late_reads", "kv_failed_bootstraps")
# what prefill counts as it sends (SGLang: a transfer's latency and size per request), read from prefill's instances
SENT = ("kv_sent", "kv_sent_ms", "kv_sent_mib")


def counter_delta(samples: Sequence[EngineSample], role: str, names: tuple[str, ...],
                  since: float | None = None) -> float | None:
    """last - first of a counter per instance of `role`, summed over instances; None when no instance has it.
    `since`: from the instance's last scrape at or before that time instead of its first (a scrape after it is
    the base where none came before)."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for s in sorted(samples, key=lambda s: s.t):
        if s.role != role:
            continue
        v = base_value(s.values, names)
        if v is None:
            continue
        if since is not None and s.t <= since:
            first[s.instance] = v
        else:
            first.setdefault(s.instance, v)
        last[s.instance] = v
    if not last:
        return None
    return float(sum(max(last[i] - first[i], 0.0) for i in last))


def _sum(values: Any) -> float | None:
    found = [v for v in values if v is not None]
    return float(sum(found)) if found else None


def kv_transfer(samples: Sequence[EngineSample],
                measured_from: Callable[[], float | None] | None = None) -> dict[str, Any] | None:
    """Decode's KV hand-off figures over the run, or None when the engine exports none (no PD, or no names).
    `measured_from`: when the run's first measured request was sent (the load's clock), asked only of a run with
    hand-off figures (it reads the run's records). The failure counters are then the measured requests' (from each
    instance's last scrape before it); the warm-up's, before it, are `warmup_failed`: the first hand-off of a fresh
    pair opens NIXL's side channel, whose handshake vLLM gives 5 s (base_worker.py, RCVTIMEO), and a warm-up request
    that times out there is the warm-up's to absorb, as any warm-up failure is. A failure scraped after the first
    measured send counts as measured, whenever it began."""
    def delta(k: str, since: float | None = None) -> float | None:
        roles = ("prefill", "decode") if k in BOTH_ROLES else ("prefill",) if k in SENT else ("decode",)
        return _sum(counter_delta(samples, role, metric_names(k), since) for role in roles)

    whole = {k: delta(k) for k in KEYS}
    if all(v is None for v in whole.values()):
        return None
    since = measured_from() if measured_from is not None else None
    got = whole | ({k: delta(k, since) for k in BOTH_ROLES} if since is not None else {})
    remote, computed, cached = got["kv_tokens_remote"], got["kv_tokens_computed"], got["kv_tokens_cached"]
    prompt = sum(v for v in (remote, computed, cached) if v is not None)
    transfers, seconds, kv_bytes = got["kv_transfers"], got["kv_transfer_seconds"], got["kv_bytes"]
    if not transfers and got["kv_sent"]:  # counted by prefill as it sends (SGLang), not by decode as it reads
        transfers, seconds = got["kv_sent"], None if got["kv_sent_ms"] is None else got["kv_sent_ms"] / 1000
        kv_bytes = None if got["kv_sent_mib"] is None else got["kv_sent_mib"] * 2 ** 20
    failures = [got[k] for k in FAILURES if got[k] is not None]
    before = [whole[k] for k in FAILURES if whole[k] is not None]
    return got | {
        "remote_share": remote / prompt if remote is not None and prompt > 0 else None,
        "transfer_s_mean": seconds / transfers if seconds is not None and transfers else None,
        "bytes_per_transfer": kv_bytes / transfers if kv_bytes is not None and transfers else None,
        "failed": sum(failures) if failures else None,
        "warmup_failed": max(sum(before) - sum(failures), 0.0) if before and since is not None else None,
    }

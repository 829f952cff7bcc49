"""The evidence of one run, typed: what the executor's digest (executor/evidence.py) makes of an engine's metrics,
its prefill batches and its latency breakdown, and what the planner reads, as attributes.

Every field the engine did not export (or a run that had none) is None, never an absent key: a rule asks
`ev.decode_waiting_mean is None`, not whether a key is there. A number the record holds as NaN, a boolean or text
that is not a number reads as None too (a scraped gauge gone wrong is missing evidence, not a zero). Keys this
model does not name (a newer digest's) are kept as they came, so a record read and written again loses nothing.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from core.evidence_parts import (Breakdown, Drift, ExpertLoad, InstanceFigures, Profile, ProfileSummary, RankGroup,
                                 Spread, number)

__all__ = ["Breakdown", "Drift", "Evidence", "ExpertLoad", "KvTransfer", "Num", "Profile", "ProfileSummary",
           "number"]


Num = Annotated[float | None, BeforeValidator(number)]


class KvTransfer(BaseModel):
    """Decode's KV hand-off over a PD run (executor/evidence_kv.py): counter deltas summed over instances."""

    model_config = ConfigDict(frozen=True, extra="allow")
    kv_tokens_remote: Num = None
    kv_tokens_computed: Num = None
    kv_tokens_cached: Num = None
    kv_bytes: Num = None
    kv_transfers: Num = None
    kv_transfer_seconds: Num = None
    kv_failed_transfers: Num = None
    kv_failed_notifications: Num = None
    kv_expired: Num = None  # leases prefill let expire: decode pulled late (not a failure by itself)
    kv_late_reads: Num = None  # reads completed after prefill released the blocks (a failure)
    kv_failed_bootstraps: Num = None  # SGLang: P/D handshakes that failed (a failure)
    kv_sent: Num = None  # SGLang: transfers prefill sent (its latency histogram's count)
    kv_sent_ms: Num = None  # their latency summed, ms
    kv_sent_mib: Num = None  # their size summed, MiB (bytes / 2**20, as SGLang computes it)
    remote_share: Num = None  # share of prompt tokens whose KV came from prefill
    transfer_s_mean: Num = None
    bytes_per_transfer: Num = None
    failed: Num = None  # failed transfers, late reads, failed bootstraps of the measured requests (else the run's)
    warmup_failed: Num = None  # the same before the first measured send: the warm-up's (not a fault by itself)


class Evidence(BaseModel):
    """One run's evidence digest. Queues are summed over a role's instances at each scrape round, then averaged
    over time; `decode_running_*` is per engine (the batch limit holds per data-parallel engine), `*_total_*`
    summed over the role."""

    model_config = ConfigDict(frozen=True, extra="allow")
    # queues
    prefill_waiting_mean: Num = None
    prefill_waiting_nonzero_share: Num = None
    decode_waiting_mean: Num = None
    decode_waiting_nonzero_share: Num = None
    # PD hand-over queues, apart from the capacity queues above
    decode_deferred_mean: Num = None  # waiting for remote KV
    decode_prealloc_mean: Num = None  # SGLang: waiting for decode KV room
    prefill_bootstrap_mean: Num = None  # SGLang: waiting for the handshake
    prefill_inflight_mean: Num = None  # SGLang: KV being sent
    # running
    decode_running_mean: Num = None
    decode_running_max: Num = None
    decode_running_total_mean: Num = None
    decode_running_total_max: Num = None
    decode_batch_limit: Num = None  # the deployment's batch cap (the knob playing batch_cap)
    decode_busy_slots_mean: Num = None  # llama.cpp: slots per decode step
    prefill_instances: Num = None
    decode_instances: Num = None
    kv_usage_max: Num = None  # max KV cache usage over engines and instances of both roles, 0-1
    decode_kv_usage_max: Num = None  # the same over decode's (and mixed) instances only: decode's KV, 0-1
    prefill_kv_usage_max: Num = None  # the same over prefill's instances only
    # speculative decoding
    spec_accept_length: Num = None
    spec_accept_per_position: list[float] | None = None  # share of drafts whose position i+1 was accepted
    kv_transfer: KvTransfer | None = None
    # per engine instance ({instance: {role, requests, running_mean, waiting_mean, batch_fill, kv_usage_max,
    # kv_tokens_remote, kv_transfers, kv_failed, ...}}) and the spread over each role's instances
    # ({role: {figure: {max_over_mean, max, min}}}): executor/evidence_instances.py
    instances: dict[str, InstanceFigures] | None = None
    instance_spread: dict[str, dict[str, Spread]] | None = None
    # per DP / EP rank of each instance with two or more ({instance: {role, ranks: {rank: figures}, combined:
    # {figure: {sum, max, median, worst, ranks}}}}): executor/evidence_ranks.py
    ranks: dict[str, RankGroup] | None = None
    # MoE expert load by role (core/evidence_decode.py)
    expert_load: dict[str, ExpertLoad] | None = None
    expert_load_spread: Num = None
    # prefill batches (the scheduler's records, or vLLM's iteration-tokens histogram)
    prefill_batch_reqs_mean: Num = None
    prefill_batch_tokens_mean: Num = None
    prefill_tail_batch_share: Num = None  # batches under 1/8 of the token budget
    prefill_batch_source: str | None = None
    # the latency breakdown by role (the simulator's, or a profile's): {role: {stage: seconds}}
    breakdown: Breakdown = Field(default_factory=Breakdown)
    samples: int = 0
    n_prefill_batches: int = 0
    concurrency: int | None = None  # the run's client cap C
    # added after the digest by the executor's collect phase
    profile: Profile | None = None  # a profile capture's summary (the simulator's: its breakdown)
    drift: Drift | None = None  # the calibrated simulator's prediction against this run
    error: str | None = None  # the digest failed: the evidence is advisory, its absence never fails collection
